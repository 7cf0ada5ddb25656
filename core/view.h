// Non-recording tensor primitives: metadata-only views and data copies.
// They are the building blocks of the differentiable Tensor methods (ops/, autograd/) and
// record nothing for backward. Every view shares storage with its input.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt::raw {

// `dim` may be negative (counts from the end); returns it in [0, ndim).
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);
// One -1 entry is inferred. Throws ShapeError when the strides cannot express the view.
Tensor view(const Tensor& t, Shape shape);
Tensor reshape(const Tensor& t, Shape shape);  // a view when possible, else a contiguous copy
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);  // python-style bounds
Tensor expand(const Tensor& t, const Shape& shape);  // -1 keeps a size; new leading dims allowed
Tensor squeeze(const Tensor& t, int64_t dim);
Tensor unsqueeze(const Tensor& t, int64_t dim);

Tensor contiguous(const Tensor& t);  // t itself when already contiguous
Tensor clone(const Tensor& t);       // always a fresh contiguous copy
Tensor to(const Tensor& t, Device device);
Tensor to(const Tensor& t, DType dtype);
Tensor to(const Tensor& t, Device device, DType dtype);

// dst += src, src broadcast to dst's shape and converted to its dtype; same device.
// Gradient accumulation uses it; bumps dst's version.
void accumulate_(const Tensor& dst, const Tensor& src);

// Broadcasts two shapes NumPy-style; throws ShapeError naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace mt::raw
