// Shape ops. The views (reshape, transpose, permute, slice, expand, ...) are
// also Tensor methods (core/tensor.h); all are differentiable and return views
// that share storage with their input where the layout allows.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt {

Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor cast(const Tensor& x, DType dtype);  // x.to(dtype): gradient cast back to x's dtype

}  // namespace mt
