// Softmax and log-softmax over one dimension.
//
//   softmax(x, dim)[..., i, ...]     = exp(x_i - m) / sum_j exp(x_j - m)
//   log_softmax(x, dim)[..., i, ...] = x_i - m - log(sum_j exp(x_j - m))
// with m = max_j x_j over `dim`: subtracting the row maximum keeps exp() from
// overflowing (x = 1000 is fine). Sums and exponentials run in acc_t (f32 for
// f16/bf16 inputs, f64 for f64); the result has x's dtype and shape and is
// contiguous. `dim` may be negative (counts from the end).
//
// Backward (y the output, dy its gradient, sums over `dim`):
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
//
// A row whose entries are all -inf gives NaN, as in PyTorch.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt {

Tensor softmax(const Tensor& x, int64_t dim = -1);      // x: [..., C, ...] -> same shape
Tensor log_softmax(const Tensor& x, int64_t dim = -1);  // x: [..., C, ...] -> same shape

}  // namespace mt
