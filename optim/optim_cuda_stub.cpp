// Built instead of the optimizers' .cu files when nvcc was not found: a CUDA
// tensor cannot exist in such a build, but the entry points must, and say why.
#include "optim/clip_grad_kernels.h"
#include "optim/optim_kernels.h"

namespace mt::optim_kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw DeviceError(std::string(what) + ": mixtrain was built without CUDA support");
}
}  // namespace

void unscale_cuda(const std::vector<Tensor>&, const Tensor&, const Tensor&) { no_cuda("GradScaler::unscale_"); }
void adamw_cuda(const std::vector<AdamWTensors>&, const AdamWArgs&, const Tensor&) { no_cuda("AdamW::step"); }
void zero_cuda(const std::vector<Tensor>&) { no_cuda("Optimizer::zero_grad"); }
Tensor clip_grad_norm_cuda(const std::vector<Tensor>&, double, double, DType, const MultiTensorConfig&) {
  no_cuda("clip_grad_norm_");
}
void scaler_update_cuda(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const ScalerUpdateArgs&) {
  no_cuda("GradScaler::update");
}

}  // namespace mt::optim_kernels
