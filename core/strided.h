// Maps a linear (row-major) element index to a strided storage offset. Passed
// by value to CUDA kernels, so it has a fixed capacity of kMaxDims dimensions.
#pragma once

#include <cstdint>

#include "core/macros.h"
#include "core/tensor.h"

namespace mt {

struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};    // [ndim]
  int64_t strides[kMaxDims] = {};  // [ndim], in elements

  StridedIndexer() = default;
  // Strides of `t` over `shape` (t must already have that shape, e.g. via expand).
  explicit StridedIndexer(const Tensor& t) : StridedIndexer(t.shape(), t.strides()) {}
  StridedIndexer(const Shape& shape, const Shape& stride) {
    MT_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "tensor has ", shape.size(), " dimensions; at most ",
             kMaxDims, " are supported");
    // Drop size-1 dims and merge dims that are contiguous with each other: fewer
    // divisions per element.
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 1) continue;
      if (ndim > 0 && strides[ndim - 1] == stride[i] * shape[i]) {
        sizes[ndim - 1] *= shape[i];
        strides[ndim - 1] = stride[i];
      } else {
        sizes[ndim] = shape[i];
        strides[ndim] = stride[i];
        ++ndim;
      }
    }
  }

  MT_HOST_DEVICE int64_t offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[d];
    }
    return off;
  }
};

}  // namespace mt
