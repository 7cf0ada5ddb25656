// Selection by a boolean mask, with NumPy broadcasting.
//
// where(condition, a, b)   // condition [...] bool or u8 (nonzero = true), a [...], b [...] floating
//   out = condition ? a : b, shape = broadcast(condition, a, b), dtype = promote_types(a, b).
//   da = sum_to(condition ? dout : 0, a.shape), db = sum_to(condition ? 0 : dout, b.shape);
//   the condition is not differentiable.
// masked_fill(x, mask, value)   // x [...] floating, mask bool or u8 broadcastable to x's shape
//   out = mask ? value : x, with x's shape and dtype; dx = mask ? 0 : dout.
//   value may be +-inf (attention masks fill with -inf).
#pragma once

#include "core/tensor.h"

namespace mt {

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace mt
