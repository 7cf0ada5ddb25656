// Internal: the select loop out[i] = cond[i] ? a[i] : b[i]. cond (bool or u8,
// read as bytes, nonzero = true), a and b are already broadcast to out's shape
// (raw::expand, any strides); a, b and out share one floating dtype.
#pragma once

#include "core/tensor.h"

namespace mt::ops {

void where_cpu(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
void where_cuda(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);

}  // namespace mt::ops
