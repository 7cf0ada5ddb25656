// Optimizers update parameters from their gradients. Parameters live in groups,
// each with its own learning rate and weight decay (PyTorch's param_groups).
//   mt::SGD opt({model_params}, mt::SGDOptions(0.1).momentum(0.9));
//   loss.backward(); opt.step(); opt.zero_grad();
//
// The contract every optimizer keeps (tests/optim/test_optim.cpp checks it for each one):
// step() and step_unless() skip a parameter whose grad() is undefined, as PyTorch does: its
// value, its version and its state (moments, step count, master weight, momentum buffer,
// autocast copy) stay as they are, and no weight decay touches it. A parameter's update reads
// only its own gradient and state (AdamW's step counts are per parameter), so two step() calls
// that each see the gradients of one part of the parameters give what one step() over all of
// them gives. DistributedDataParallel::step relies on both: it steps while the last bucket is
// still being reduced, with only the other buckets' gradients handed out, then steps again
// with the last bucket's.
#pragma once

#include <map>
#include <string>

#include <vector>

#include "core/tensor.h"

namespace mt {

namespace detail {
// Copies `state` into `mine` (the same names and shapes, both ways), naming what does not match.
void load_optimizer_state(const char* optimizer, const std::map<std::string, Tensor>& mine,
                          const std::map<std::string, Tensor>& state);
}  // namespace detail

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
  // Drops every gradient (set_to_none, the PyTorch default): the next backward writes
  // fresh gradients instead of adding into zeroed buffers. With set_to_none false the
  // buffers are kept and zeroed, which a step captured in a CUDA Graph needs (its
  // gradients must live at the same addresses from one replay to the next).
  void zero_grad(bool set_to_none = true);
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Called by CudaGraphStep before each replay: brings what the captured kernels read from
  // device memory up to date with the host values. Returns whether the learning rates are
  // read that way (then a schedule may change them between replays); the default: no.
  virtual bool prepare_replay() { return false; }
  // Called by CudaGraphStep once a capture of the step has ended (and succeeded).
  virtual void after_capture() {}
  std::vector<ParamGroup>& param_groups() { return groups_; }

  // Per-parameter state for checkpoints: "g<group>.p<index>.<name>" -> tensor (moments, step
  // counts, master weights). Loading copies into the optimizer's own tensors and checks that
  // names and shapes match those this optimizer holds.
  virtual std::map<std::string, Tensor> state_dict() const = 0;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state) = 0;

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups);
  std::vector<ParamGroup> groups_;
};

}  // namespace mt
