// Internal: embedding gather / scatter-add kernels. Callers validate; these
// assume weight/out/grad contiguous, ids contiguous i64 or i32.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

// out[n, :] = weight[ids[n], :]                 out // [N, C], weight // [V, C], ids // [N]
// Throws (CPU) naming the first out-of-range id; CUDA writes NaN rows for them.
void embedding_forward_cpu(const Tensor& out, const Tensor& weight, const Tensor& ids);
void embedding_forward_cuda(const Tensor& out, const Tensor& weight, const Tensor& ids);

// grad_weight[ids[n], :] += grad_out[n, :]      grad_weight // [V, C] zeros in acc_t (f64 or f32),
//                                               grad_out    // [N, C] any floating dtype
void embedding_backward_cpu(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& ids);
void embedding_backward_cuda(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& ids);

}  // namespace mt::ops
