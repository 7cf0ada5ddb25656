// FP8 with one scale per row: the frozen base of a LoRA model stored in E4M3 with a scale per
// output channel, and the GEMMs that read it (forward and input gradient) in FP8.
//
// Note [FP8 frozen base]
// A frozen Linear's weight W [N, K] is kept only as q [N, K] f8e4m3 and scale_inv [N] f32, with
// W[n, k] ~ q[n, k] * scale_inv[n]: each output channel (row) cast with its own current scale
// 448 / max_k |W[n, k]| (quantize_fp8_rows), 1 byte an element, never widened again. One scale per
// channel rather than per tensor: a channel with large weights does not coarsen the others, and the
// GEMM applies the per-channel factors in its epilogue for free.
//   forward   x [M, K] is cast per row (per token) the same way, just in time, and
//             y[m, n] = (q(x) q^T)[m, n] * sx_inv[m] * scale_inv[n] + b[n]
//             by one FP8 GEMM whose epilogue applies both vectors (fp8_rowwise_gemm; cuBLASLt's
//             outer-vector scales on the GPU).
//   dgrad     dx[m, k] = sum_n dy[m, n] scale_inv[n] q[n, k]: g = dy * scale_inv (by column) is
//             cast per row to E4M3 in one pass, q is transposed to [K, N] (Hopper's FP8 GEMMs read
//             both operands K-major; the copy lives for one layer's backward), and
//             dx[m, k] = (q(g) q)[m, k] * sg_inv[m], as fp8_rowwise_gemm(q(g), q^T) reads it.
//   no weight gradient: q and scale_inv are constants; the backward keeps them (the layer's own
//             tensors, no copy) and nothing of x.
// The gradient is cast to E4M3, not E5M2 as under one scale per tensor (fp8_linear): with a scale
// per row the range that E5M2's extra exponent bit buys is covered by the scales, and the extra
// mantissa bit halves the rounding (DeepSeek-V3, section 3.3.2, casts every tensor to E4M3 for that
// reason under fine-grained scales).
// Scales are current (from the tensor being cast), so nothing is carried from step to step: a
// recomputation (gradient checkpointing) or a CUDA Graph replay casts exactly as the first pass did.
//
// Shapes. N and K must be multiples of 16 (cuBLASLt's FP8 rule, kept on every device so that what
// runs on the CPU runs on the GPU). M may be anything: the row cast writes zero rows up to the next
// multiple of 16 (no padded copy of x or dy) and the padding is cut from y and dx.
//
// Accuracy. Each element of x, g and W is rounded with relative error at most 2^-4 (E4M3's 3
// mantissa bits) or, below E4M3's normal range, absolute error 2^-10 / s of its row; the GEMMs add
// in f32. tests/ops/test_fp8_rowwise.cpp checks the forward and dx against f64 within that bound.
#pragma once

#include "core/tensor.h"
#include "ops/fp8/fp8.h"
#include "ops/matmul/matmul.h"

namespace mt {

struct Fp8RowQuantized {
  Tensor data;       // [R, C] f8e4m3 or f8e5m2
  Tensor scale_inv;  // [R] f32: row r stands for data[r] * scale_inv[r]
};

// x [R, C] (f64/f32/f16/bf16) cast row by row with the row's current scale: for row r,
// v = x[r] * column_scale (when given: f32 [C] on x's device), s = fp8_max(format) / max |v|
// (1 when that max is 0, infinite or NaN; FLT_MAX when the quotient overflows), data[r] =
// fp8(v * s) by Note [Conversion rule] (saturating), scale_inv[r] = 1 / s. The same bits on the CPU
// and CUDA; one pass over x on CUDA where a row fits the registers (up to 16,384 aligned columns).
// Records no autograd history.
Fp8RowQuantized quantize_fp8_rows(const Tensor& x, DType format = DType::f8e4m3, const Tensor& column_scale = Tensor());

// y [M, N] = (a_q [M, K] b_q [N, K]^T)[i, j] * row_scale_inv_a[i] * row_scale_inv_b[j] + bias[j],
// accumulated in f32 and written as out_dtype (bf16 or f32); bias [N] bf16 or undefined.
// a_q and b_q are f8e4m3 or f8e5m2, not both f8e5m2; the scale vectors f32 [M] and [N]; M, N and K
// multiples of 16. Native (a GPU of compute capability 8.9 or later): one cuBLASLt GEMM with
// outer-vector scales, or, where cuBLASLt does not offer them, fp8_gemm with unit scales into f32
// and the scaling as the emulation does it (with a warning on stderr, once per device and shape:
// that second pass is slow). Emulation: fp8_gemm's f32 GEMM of the exact operands,
// then (product * row_scale_inv_a[i]) * row_scale_inv_b[j] + bias[j] in f32, rounded once.
Tensor fp8_rowwise_gemm(const Tensor& a_q, const Tensor& b_q, const Tensor& row_scale_inv_a,
                        const Tensor& row_scale_inv_b, DType out_dtype, const Tensor& bias = Tensor(),
                        Fp8Compute compute = Fp8Compute::automatic);

// y [..., N] = x [..., K] W^T + bias with W held as weight_q [N, K] f8e4m3 and weight_scale_inv [N]
// f32 (Note [FP8 frozen base]). Neither may require grad; bias [N] or undefined, read in bf16 by
// the GEMM (what cuBLASLt's FP8 kernels take). Gradients: dx by the FP8 dgrad above (in x's dtype),
// db = dy's row sums in f32. Autocast treats it as linear: y has the autocast dtype under autocast,
// else x's and the bias's promoted dtype.
Tensor fp8_rowwise_linear(const Tensor& x, const Tensor& weight_q, const Tensor& weight_scale_inv,
                          const Tensor& bias = Tensor());

// lora_linear (ops/matmul/matmul.h) over an FP8 base: y = fp8_rowwise_linear(x, ...) +
// scale * (h A^T) B^T, the adapter's last GEMM adding onto the base GEMM's output (beta 1).
//   x, h [..., K]   weight_q [N, K] f8e4m3, weight_scale_inv [N] f32 (frozen)   bias [N] or undefined
//   lora_a [r, K], lora_b [N, r] in any floating dtype (f32 over an FP8 base)
// The adapter's GEMMs run in the promoted dtype of x, h, the bias and the factors (the autocast
// dtype under autocast, which treats the op as linear). Gradients: dx as fp8_rowwise_linear's, and
// the adapter's as lora_linear's (dB = scale g^T t, dt = scale g B, dA = dt^T h, dh = dt A).
// With OutputValues::unread, recorded with its output unwritten, as lora_linear.
Tensor fp8_lora_linear(const Tensor& x, const Tensor& h, const Tensor& weight_q, const Tensor& weight_scale_inv,
                       const Tensor& bias, const Tensor& lora_a, const Tensor& lora_b, double scale,
                       OutputValues values = OutputValues::computed);

}  // namespace mt
