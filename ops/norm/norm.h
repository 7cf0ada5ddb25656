// Normalisation over the last dimension: layer norm and RMS norm.
//
// x is [..., C]: every leading index is one row of C elements. weight and bias
// are [C] or undefined (no affine term), on x's device and of x's dtype (under
// autocast both ops run in f32, so the parameters and input agree).
//
//   layer_norm: mean = sum_c x_c / C,  var = sum_c (x_c - mean)^2 / C  (biased, as PyTorch)
//               y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)
//   rms_norm:   y = x * rstd * weight,                   rstd = 1 / sqrt(sum_c x_c^2 / C + eps)
//
// Statistics are computed in acc_t (f32 for f16/bf16, f64 for f64) and kept per
// row for backward (mean and rstd for layer_norm, rstd for rms_norm); y has x's
// dtype and shape. With xhat = (x - mean) * rstd (mean = 0 for RMS) and
// g = dy * weight:
//   dx      = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))   (rms_norm: no mean_c(g) term)
//   dweight = sum over rows of dy * xhat,   dbias = sum over rows of dy
// Only the gradients that are needed are computed.
#pragma once

#include "core/tensor.h"

namespace mt {

// x: [..., C]; weight, bias: [C] or undefined. Returns [..., C].
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x: [..., C]; weight: [C] or undefined. Returns [..., C].
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// The same, with y written in out_dtype: statistics and math stay in acc_t, and y is
// rounded once, as it is stored. An f32 x (the residual stream under autocast) with a
// bf16/f16 out_dtype is the input a following GEMM wants: on CUDA one kernel writes it
// (no f32 y, no cast pass) and backward reads the half gradient directly; the values
// equal layer_norm(...).to(out_dtype) and its gradients bit for bit. Other dtype pairs
// compute in x's dtype and convert.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, DType out_dtype);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, DType out_dtype);

// The residual add and the norm after it, in one pass: sum = x + delta, normed = the norm of
// sum, as add() then layer_norm() / rms_norm() compute them (bit for bit). A transformer
// block's `h = x + attn(...); n = ln_2(h)` reads and writes the residual stream once instead of
// twice, and in backward the norm's input gradient and sum's gradient are added as the first
// is stored, with delta's copy written in its own dtype in the same pass (no separate sum of
// gradients, no cast). delta has x's shape and dtype, or is f16/bf16 beside an f32 x (the
// residual stream under autocast, a GEMM's output beside it); sum has x's dtype, normed x's or
// out_dtype (as for layer_norm above). On CUDA one kernel does each direction.
struct AddNorm {
  Tensor sum;     // x + delta, [..., C]
  Tensor normed;  // [..., C]
};
AddNorm add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias,
                       double eps = 1e-5);
AddNorm add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps,
                       DType out_dtype);
AddNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps = 1e-6);
AddNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps, DType out_dtype);

}  // namespace mt
