// Internal: the CPU and CUDA kernels behind ops/fp8/fp8_rowwise.h. The row cast shares its
// arithmetic (abs_bits, scaled, scale_from_amax) with the per-tensor cast of fp8_kernels.h, so the
// two devices agree bit for bit.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

// One row cast, validated by quantize_fp8_rows / the ops that call it.
//   x             [R, C] f64/f32/f16/bf16, contiguous
//   column_scale  [C] f32, contiguous, or undefined (then 1)
//   out           [P, C] f8e4m3 or f8e5m2, contiguous, P >= R
//   scale_inv     [P] f32
// Row r < R: v = scaled(x[r, c], column_scale[c]), a = max_c |v| (NaN if a v is), s =
// scale_from_amax(a, fp8_max(format), 1), out[r, c] = fp8(scaled(v, s)), scale_inv[r] = 1 / s.
// Rows R <= r < P are padding (the rows a GEMM's M is rounded up to): zeros, scale_inv 1.
struct RowCast {
  Tensor x, column_scale, out, scale_inv;
};
void quantize_rows_cpu(const RowCast& c);
void quantize_rows_cuda(const RowCast& c);

// out [C, R] = in [R, C]^T for one-byte elements (FP8); both contiguous, R and C multiples of 4,
// both pointers 4-byte aligned.
void transpose_bytes_cuda(const Tensor& in, const Tensor& out);

// out [M, N] = (a [M, K] b [N, K]^T) * scale_inv_a[i] * scale_inv_b[j] + bias[j] through
// cuBLASLt's outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), validated by
// fp8_rowwise_gemm: a and b fp8 (not both f8e5m2), contiguous, 16-byte aligned; scale_inv_a [M]
// and scale_inv_b [N] f32; out bf16 or f32; bias [N] bf16 or undefined.
struct Fp8RowwiseGemmProblem {
  Tensor a, b;
  Tensor scale_inv_a, scale_inv_b;
  Tensor out;
  Tensor bias;
};
// Returns false, having run nothing, when cuBLASLt has no algorithm with outer-vector scales for
// the problem (the scale mode is newer than the FP8 kernels, and not every GPU and library offer
// it); fp8_rowwise_gemm then scales the output of a unit-scale fp8_gemm itself.
bool fp8_rowwise_gemm_cuda(const Fp8RowwiseGemmProblem& p);

}  // namespace mt::ops
