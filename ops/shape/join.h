// Joining and splitting along a dimension. All differentiable; `dim` may be
// negative (counts from the end).
//
// cat(tensors, dim)     // each [..., n_i, ...] -> [..., sum n_i, ...]; same dtype, device and
//                       // ndim, shapes equal except along dim. Copies into a new tensor;
//                       // the gradient of input i is the window [off_i, off_i + n_i) of dout.
// stack(tensors, dim)   // k tensors of one shape S -> S with a new dim of size k at `dim`
//                       // (dim in [-(ndim+1), ndim]); = cat of each unsqueezed at dim.
// split(x, split_size, dim)  // chunks of split_size along dim, the last one smaller when
//                            // split_size does not divide it; views of x.
// split(x, sizes, dim)       // pieces of the given sizes (summing to x.size(dim)); views of x.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

}  // namespace mt
