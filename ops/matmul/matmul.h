// Matrix products: matmul (NumPy/PyTorch semantics), bmm and linear.
//
// Layout: row-major, the last two dimensions are the matrix, the leading ones
// are batch dimensions. Mixed floating dtypes promote (promote_types) as the
// element-wise ops do; inputs on different devices are an error. Products
// accumulate in f32 for f16/bf16/f32 inputs and in f64 for f64 (on CUDA:
// cuBLASLt with CUBLAS_COMPUTE_32F, no TF32; CUBLAS_COMPUTE_64F for f64); the
// result has the promoted input dtype.
//
// Gradients (C = A B): dA = dC B^T, dB = A^T dC, each summed over the batch
// dimensions its input was broadcast along, and each computed only when that
// input needs it.
#pragma once

#include "core/tensor.h"

namespace mt {

// a [..., M, K] @ b [..., K, N] -> [..., M, N], batch dims broadcast NumPy-style.
// A 1-D a [K] is treated as [1, K] and a 1-D b [K] as [K, 1]; the added
// dimension is removed from the result ([K] @ [K] -> [] is a dot product).
Tensor matmul(const Tensor& a, const Tensor& b);

// a [B, M, K] @ b [B, K, N] -> [B, M, N]; no broadcasting.
Tensor bmm(const Tensor& a, const Tensor& b);

// y = x W^T + b.
//   x      [..., in]  (any number of leading dims, including none)
//   weight [out, in]
//   bias   [out] or undefined (no bias)
//   y      [..., out]
// Gradients: dx = dy W, dW = dy^T x and db = sum of dy over the leading dims,
// with the leading dims of x and dy flattened into one.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace mt
