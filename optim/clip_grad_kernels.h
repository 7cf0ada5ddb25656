// Internal: the gradient-norm clipping loops, one per device. The public entry
// (optim/clip_grad.h) validates and hands over a list of contiguous gradients on
// one device, of dtypes f64/f32/f16/bf16.
//
// Both devices compute the same thing: each gradient is cut into chunks of
// config.chunk_size elements; a chunk's sum of squares accumulates in acc_t
// (f32, f64 for f64 gradients); chunk sums add up in f64; total = sqrt of that,
// rounded to out_dtype (f32, or f64 when every gradient is f64). The coefficient
// is clip_coefficient(total as rounded) and every gradient is multiplied by it in
// acc_t (skipped when it is exactly 1). On CUDA the total and the coefficient
// never leave the device.
#pragma once

#include <vector>

#include "core/macros.h"
#include "core/tensor.h"
#include "optim/multi_tensor.h"

namespace mt::optim_kernels {

// min(1, max_norm / (total + eps)), except that NaN propagates as it does through
// torch.clamp(max=1): a NaN total gives a NaN coefficient, an infinite one gives 0.
MT_HOST_DEVICE inline double clip_coefficient(double total, double max_norm, double eps) {
  const double c = max_norm / (total + eps);
  const bool is_nan = c != c;
  return (c < 1.0 || is_nan) ? c : 1.0;
}

// Returns the total norm, a 0-d tensor of out_dtype on the gradients' device.
Tensor clip_grad_norm_cpu(const std::vector<Tensor>& grads, double max_norm, double eps, DType out_dtype,
                          const MultiTensorConfig& config = {});
// One multi-tensor launch per dtype (more when the tables fill) for the sums of
// squares, one single-block launch for the total and the coefficient, one
// multi-tensor launch per dtype for the scaling. No host sync.
Tensor clip_grad_norm_cuda(const std::vector<Tensor>& grads, double max_norm, double eps, DType out_dtype,
                           const MultiTensorConfig& config = {});

}  // namespace mt::optim_kernels
