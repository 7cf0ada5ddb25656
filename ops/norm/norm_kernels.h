// Internal: the fused norm kernels. x, y, dy, dx are contiguous rows [rows, C];
// weight, bias, dweight, dbias are contiguous [C] of x's dtype; mean and rstd
// are [rows] in the accumulation dtype (f32, or f64 for f64 inputs). y and dy
// have x's dtype, except that on CUDA an f32 x may come with a bf16/f16 y or dy.
// RMS norm is layer norm with the mean fixed at 0 and no bias: `mean` is
// undefined for it. An undefined weight / bias means "no affine term"; an
// undefined dx / dweight / dbias means "not needed"; x, mean and rstd are read
// only for dx and dweight (the row count and C come from dy).
//
// add_layer_norm / add_rms_norm fuse the residual add before the norm: the CUDA
// kernels take it as a NormResidual (forward) and a NormResidualGrad (backward);
// the CPU runs the add and the norm one after the other.
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

// The norm's input is x + delta, rounded to x's dtype as add() stores it, and written to sum.
struct NormResidual {
  Tensor delta;  // [rows, C]: x's dtype, or y's half type for an f32 x; undefined: no residual
  Tensor sum;    // [rows, C] in x's dtype
};

// dx = the norm's input gradient + dsum (the sum output's gradient), each rounded to x's
// dtype as the engine's sum of the two would be; ddelta gets the same values in delta's dtype.
struct NormResidualGrad {
  Tensor dsum;    // [rows, C] in x's dtype; undefined: none (dx is the norm's term alone)
  Tensor ddelta;  // [rows, C] in dy's half type beside an f32 x; undefined: not written
};

void norm_forward_cpu(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, double eps);
void norm_forward_cuda(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, double eps, const NormResidual& residual = {});

void norm_backward_cpu(NormKind kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                       const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight);
void norm_backward_cuda(NormKind kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                        const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                        const NormResidualGrad& residual = {});

}  // namespace mt::ops
