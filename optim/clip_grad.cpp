#include "optim/clip_grad.h"

#include <cmath>

#include "core/view.h"
#include "ops/common.h"
#include "ops/map.h"
#include "optim/clip_grad_kernels.h"

namespace mt {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double eps) {
  MT_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  MT_CHECK(eps >= 0 && std::isfinite(eps), "clip_grad_norm_: eps must be finite and >= 0, got ", eps);

  // The gradients to clip, validated before anything is written.
  std::vector<Tensor> grads;    // as the parameters hold them
  std::vector<size_t> indices;  // their parameters' positions, for messages
  for (size_t i = 0; i < params.size(); ++i) {
    MT_CHECK(params[i].defined(), "clip_grad_norm_: parameter ", i, " is an undefined tensor");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    const DType dt = g.dtype();
    MT_CHECK_T(DTypeError, dt == DType::f64 || dt == DType::f32 || dt == DType::f16 || dt == DType::bf16,
               "clip_grad_norm_: the gradient of parameter ", i, " is ", ops::describe(g),
               "; gradients must be f64, f32, f16 or bf16");
    if (!grads.empty()) {
      MT_CHECK_T(DeviceError, g.device() == grads.front().device(), "clip_grad_norm_: the gradient of parameter ", i,
                 " is on ", g.device().str(), " but that of parameter ", indices.front(), " on ",
                 grads.front().device().str(), "; all gradients must be on one device");
    }
    grads.push_back(std::move(g));
    indices.push_back(i);
  }
  if (grads.empty()) {
    const Device device = params.empty() ? kCPU : params.front().device();
    return zeros({}, TensorOptions().dtype(DType::f32).device(device));
  }

  bool all_f64 = true;
  for (const Tensor& g : grads) all_f64 = all_f64 && g.dtype() == DType::f64;
  const DType out_dtype = all_f64 ? DType::f64 : DType::f32;

  // The kernels work on contiguous memory: a strided gradient is clipped in a
  // contiguous copy and copied back.
  std::vector<Tensor> work;
  work.reserve(grads.size());
  for (const Tensor& g : grads) work.push_back(raw::contiguous(g));

  Tensor total;
  if (grads.front().is_cuda()) {
#if MT_WITH_CUDA
    total = optim_kernels::clip_grad_norm_cuda(work, max_norm, eps, out_dtype);
#else
    ops::throw_no_cuda("clip_grad_norm_");
#endif
  } else {
    total = optim_kernels::clip_grad_norm_cpu(work, max_norm, eps, out_dtype);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (work[i].shares_storage_with(grads[i])) {
      grads[i].bump_version();
    } else {
      grads[i].copy_(work[i]);
    }
  }
  return total;
}

}  // namespace mt
