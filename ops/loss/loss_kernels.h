// Internal: the fused cross-entropy kernels. Logits are contiguous rows
// [rows, classes] (the class dim last); target is contiguous [rows] (i64 or
// i32). Per-row results (loss, logsumexp) are in the accumulation dtype A
// (f32, or f64 for f64 logits), as is the reduced output.
#pragma once

#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"
#include "ops/loss/loss.h"

namespace mt::ops {

// The loss dtype A (f32 or f64) as a type: f(TypeTag<A>{}).
template <typename F>
void dispatch_loss_dtype(DType dtype, F&& f) {
  MT_INTERNAL_ASSERT(dtype == DType::f32 || dtype == DType::f64, "cross_entropy: loss dtype ", dtype_name(dtype));
  if (dtype == DType::f64) {
    f(TypeTag<double>{});
  } else {
    f(TypeTag<float>{});
  }
}

// loss [rows] (A): lse - logits[t] (0 where t == ignore_index; NaN for an
// out-of-range t on CUDA); lse [rows] (A): logsumexp of each row, for backward.
void cross_entropy_forward_cpu(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                               int64_t ignore_index);
void cross_entropy_forward_cuda(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                                int64_t ignore_index);

// out [] (A) = sum of loss, divided by count for mean; count [] (i64) = rows
// whose target is not ignore_index. Both computed on the device (no host sync).
void cross_entropy_reduce_cpu(const Tensor& out, const Tensor& count, const Tensor& loss, const Tensor& target,
                              int64_t ignore_index, Reduction reduction);
void cross_entropy_reduce_cuda(const Tensor& out, const Tensor& count, const Tensor& loss, const Tensor& target,
                               int64_t ignore_index, Reduction reduction);

// dlogits [rows, classes] (logits' dtype) = (exp(logits - lse) - onehot(t)) * g_r,
// zero for ignored rows; grad is [rows] (none) or [] (sum, mean: divided by count).
// count is read only for mean.
void cross_entropy_backward_cpu(const Tensor& dlogits, const Tensor& grad, const Tensor& logits, const Tensor& target,
                                const Tensor& lse, const Tensor& count, int64_t ignore_index, Reduction reduction);
void cross_entropy_backward_cuda(const Tensor& dlogits, const Tensor& grad, const Tensor& logits, const Tensor& target,
                                 const Tensor& lse, const Tensor& count, int64_t ignore_index, Reduction reduction);

// linear_cross_entropy's per-chunk step: loss and lse per row as
// cross_entropy_forward, then the logits overwritten in place by
// softmax - onehot (the gradient of a unit summed loss; zero rows for
// ignore_index). On CUDA one kernel does both, reading each row from memory once
// (its second read comes from L2) with 16-byte loads.
void cross_entropy_unit_grad_inplace_cpu(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                                         const Tensor& target, int64_t ignore_index);
void cross_entropy_unit_grad_inplace_cuda(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                                          const Tensor& target, int64_t ignore_index);

// out = in * g, element-wise over contiguous tensors of equal numel, where g is
// the loss's incoming gradient grad [] (loss dtype A), divided by count [] (i64)
// for mean. in has out's dtype or A (a gradient accumulated in f32 for an f16/bf16
// output); the product is formed in A and rounded once. Used by
// linear_cross_entropy, whose forward leaves the gradient for a unit loss.
void scale_by_loss_grad_cpu(const Tensor& out, const Tensor& in, const Tensor& grad, const Tensor& count,
                            Reduction reduction);
void scale_by_loss_grad_cuda(const Tensor& out, const Tensor& in, const Tensor& grad, const Tensor& count,
                             Reduction reduction);

}  // namespace mt::ops
