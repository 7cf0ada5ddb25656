// Optimizers update parameters from their gradients. Parameters live in groups,
// each with its own learning rate and weight decay (PyTorch's param_groups).
//   mt::SGD opt({model_params}, mt::SGDOptions(0.1).momentum(0.9));
//   loss.backward(); opt.step(); opt.zero_grad();
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt {

struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // Steps unless found_inf (an f32 [1] tensor from the GradScaler) is non-zero.
  // The default reads the flag on the host; fused optimizers read it on the device.
  virtual void step_unless(const Tensor& found_inf);
  // Drops every gradient (set to none, the PyTorch default): the next backward
  // writes fresh gradients instead of adding into zeroed buffers.
  void zero_grad();
  std::vector<ParamGroup>& param_groups() { return groups_; }

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups);
  std::vector<ParamGroup> groups_;
};

}  // namespace mt
