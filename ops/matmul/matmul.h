// Matrix products: matmul (NumPy/PyTorch semantics), bmm, linear, linear_gelu, mlp_gelu and
// lora_linear.
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

// Whether an op writes its output (computed), or only records itself for backward, its output
// allocated and left unwritten (unread): for a checkpointed segment's recomputation whose output
// no op reads (mt::in_recomputation, autograd/checkpoint.h). Only ops whose backward never reads
// their own output take it; their gradients are the same either way. Under anomaly detection,
// which reads every recorded output, they compute it all the same.
enum class OutputValues { computed, unread };

// y = x W^T + b.
//   x      [..., in]  (any number of leading dims, including none)
//   weight [out, in]
//   bias   [out] or undefined (no bias)
//   y      [..., out]
// Gradients: dx = dy W, dW = dy^T x and db = sum of dy over the leading dims,
// with the leading dims of x and dy flattened into one. OutputValues::unread: recorded, y unwritten.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              OutputValues values = OutputValues::computed);

// h = gelu_tanh(x W^T + b): linear and the GELU (tanh form, as gelu(..., tanh)) as one op,
// the first layer of a transformer MLP. Shapes as linear's; the bias is required.
// On CUDA in f16/bf16 it is one cuBLASLt GEMM whose epilogue adds the bias, applies the
// GELU and writes the pre-activation x W^T + b beside h; elsewhere (the CPU, f32, f64,
// an output width that is not a multiple of 8) the GEMM writes the pre-activation and
// the GELU is a second pass, exactly gelu(linear(x, weight, bias)). The epilogue applies
// the GELU before rounding the pre-activation to the output dtype, so there the two agree
// to that dtype's rounding.
// Gradients: dpre = dh gelu_tanh'(pre) (the pre-activation is saved, not h), then
// linear's gradients with dpre for dy. Autocast treats it as linear.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// y = gelu_tanh(x W1^T + b1) W2^T + b2: a transformer MLP (linear_gelu, then linear) as one
// op, like apex's FusedDenseGeluDense.
//   x  [..., in]   w1 [hidden, in]   b1 [hidden]   w2 [out, hidden]   b2 [out]   y [..., out]
// Both biases are required. Both layers run in the promoted dtype of all five inputs. The
// forward is linear_gelu's GEMM (the GELU in its epilogue where it can be) and linear's.
// Gradients: dW2 = dy^T h and db2 as linear's; dpre = (dy W2) gelu_tanh'(pre), then linear's
// gradients of (x, W1, b1) with dpre for dy. On CUDA in f16/bf16 the dpre GEMM applies
// gelu_tanh' itself (cuBLASLt's DGELU epilogue, reading the saved pre-activation) where the
// hidden width is a multiple of 8; elsewhere the GEMM writes dy W2 and the derivative is a
// second pass: with inputs of one dtype, exactly linear(linear_gelu(x, w1, b1), w2, b2)'s
// computation. The epilogue multiplies the f32 product before rounding it, so there the two
// agree to the dtype's rounding. Only what the requested gradients read is saved (h for dW2;
// W1 for dx; x for dW1; pre and W2 for any of the first layer's gradients).
// Autocast treats it as linear.
Tensor mlp_gelu(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2);

// A linear layer with a LoRA adapter, y = x W^T + b + scale * (h A^T) B^T, in three GEMMs:
// the base (bias in its epilogue), t = h A^T, and t B^T added onto y by the third GEMM
// itself (alpha = scale, beta = 1): no separate adapter output, scaling or sum.
//   x      [..., in]   the base's input
//   h      [..., in]   the adapter's input: x, or x after dropout
//   weight [out, in], bias [out] or undefined, lora_a [r, in], lora_b [out, r]
// Gradients: the base's as linear's; dB = scale g^T t, dt = scale g B, dA = dt^T h,
// dh = dt A (each only when needed; with h the same tensor as x the two sum).
// Autocast treats it as linear. With OutputValues::unread the op is recorded as ever, but its
// output is left unwritten: only t = h A^T, which dB reads, is computed.
Tensor lora_linear(const Tensor& x, const Tensor& h, const Tensor& weight, const Tensor& bias, const Tensor& lora_a,
                   const Tensor& lora_b, double scale, OutputValues values = OutputValues::computed);

}  // namespace mt
