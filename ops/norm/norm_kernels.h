// Internal: the fused norm kernels. x, y, dy, dx are contiguous rows [rows, C];
// weight, bias, dweight, dbias are contiguous [C] of x's dtype; mean and rstd
// are [rows] in the accumulation dtype (f32, or f64 for f64 inputs). y and dy
// have x's dtype, except that on CUDA an f32 x may come with a bf16/f16 y or dy.
// RMS norm is layer norm with the mean fixed at 0 and no bias: `mean` is
// undefined for it. An undefined weight / bias means "no affine term"; an
// undefined dx / dweight / dbias means "not needed"; x, mean and rstd are read
// only for dx and dweight (the row count and C come from dy).
#pragma once

#include "core/tensor.h"

namespace mt::ops {

enum class NormKind { layer, rms };

inline const char* name_of(NormKind kind) { return kind == NormKind::layer ? "layer_norm" : "rms_norm"; }

// The data of an optional tensor (undefined: null), for the kernels' optional operands.
template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <typename T>
T* mutable_data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

void norm_forward_cpu(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, double eps);
void norm_forward_cuda(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, double eps);

void norm_backward_cpu(NormKind kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                       const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight);
void norm_backward_cuda(NormKind kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                        const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight);

}  // namespace mt::ops
