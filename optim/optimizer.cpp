#include "optim/optimizer.h"

#include <map>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/error.h"
#include "optim/optim_kernels.h"

namespace mt {

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  for (const ParamGroup& g : groups_) {
    MT_CHECK(g.lr >= 0, "Optimizer: learning rate must be >= 0, got ", g.lr);
    for (const Tensor& p : g.params) {
      MT_CHECK(p.defined() && p.requires_grad() && p.is_leaf(),
               "Optimizer: every parameter must be a leaf tensor that requires grad");
    }
  }
}

void Optimizer::step_unless(const Tensor& found_inf) {
  if (found_inf.item() == 0.0) step();
}

namespace detail {

void load_optimizer_state(const char* optimizer, const std::map<std::string, Tensor>& mine,
                          const std::map<std::string, Tensor>& state) {
  for (const auto& [name, t] : mine) {
    const auto it = state.find(name);
    MT_CHECK(it != state.end(), optimizer, "::load_state_dict: the state has no '", name,
             "' (was it saved from an optimizer over the same parameters?)");
    MT_CHECK_T(ShapeError, it->second.shape() == t.shape(), optimizer, "::load_state_dict: '", name, "' has shape ",
               shape_str(it->second.shape()), " in the state but ", shape_str(t.shape()), " here");
    check_loadable(std::string(optimizer) + "::load_state_dict", name, it->second.dtype(), t.dtype());
  }
  for (const auto& [name, t] : state) {
    MT_CHECK(mine.count(name), optimizer, "::load_state_dict: unexpected entry '", name,
             "' (the state holds more parameters or another kind of state)");
  }
  NoGradGuard no_grad;
  for (const auto& [name, t] : mine) t.copy_(state.at(name));
}

}  // namespace detail

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  // Contiguous f64/f32/f16/bf16 CUDA gradients, per device: zeroed by one launch per dtype (in a
  // captured step, one graph node instead of a memset node per parameter); others by zero_().
  std::map<int, std::vector<Tensor>> on_device;
  for (ParamGroup& g : groups_) {
    for (Tensor& p : g.params) {
      if (set_to_none) {
        p.set_grad(Tensor());
        continue;
      }
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (grad.is_cuda() && grad.is_contiguous() && is_compute_floating(grad.dtype())) {
        on_device[grad.device().index].push_back(grad);
      } else {
        p.grad().zero_();
      }
    }
  }
  for (const auto& [device, grads] : on_device) {
    cuda::DeviceGuard guard(device);
    optim_kernels::zero_cuda(grads);
    for (const Tensor& grad : grads) grad.bump_version();  // as zero_() would
  }
}

}  // namespace mt
