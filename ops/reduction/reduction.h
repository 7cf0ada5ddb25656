// Reductions over dimensions. `dims` empty means all dimensions; negative dims
// count from the end; keepdim keeps reduced dimensions with size 1.
// Accumulation is in f32 for f16/bf16 inputs (f64 for f64); the result has the
// input's dtype.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Maximum values over one dimension (all of them when dim is omitted). The gradient
// is shared equally among tied maxima.
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);
// Variance with Bessel's correction by default (correction = 1, as torch.var).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

// Sums a broadcast gradient back to `shape` (the inverse of expand). Differentiable.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace mt
