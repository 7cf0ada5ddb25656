// Internal: the CPU and CUDA kernels behind ops/fp8/fp8.h and fp8_scaling.h, and the arithmetic
// both devices share (inline here, compiled for each, so that the two agree bit for bit).
#pragma once

#include <cfloat>
#include <cstdint>

#include "core/float_types.h"
#include "core/macros.h"
#include "core/tensor.h"
#include "ops/fp8/fp8.h"
#include "ops/fp8/fp8_scaling.h"

namespace mt::ops {

// |v| as the bits of a nonnegative f32. On these, unsigned order is float order and every NaN
// lies above +inf, so a max over the bits is max |x| with NaN propagating; and a max is exact in
// any order, so per-thread, per-block and atomic partial maxima give the same bits on both devices.
MT_HOST_DEVICE inline uint32_t abs_bits(float v) { return bits::f32_to_u32(v) & 0x7fffffffu; }

// x * scale as the cast rounds it. A NaN product is x itself when x is the NaN (its sign and
// payload, which the conversion keeps), else the canonical quiet NaN (x infinite and scale 0, or a
// NaN scale): processors disagree on the NaN an arithmetic result carries (x86 passes an operand's
// on, NVIDIA GPUs return one canonical NaN), and the cast must give the same bits on both.
MT_HOST_DEVICE inline float scaled(float x, float scale) {
  const float v = x * scale;
  if (v == v) return v;
  return x != x ? x : bits::u32_to_f32(0x7fc00000u);
}

// scaled_max / amax (scaled_max = fp8_max * 2^-margin), or `fallback` when amax is 0, infinite or
// NaN; FLT_MAX when the quotient overflows (Transformer Engine's rule, recipe_common.cuh).
MT_HOST_DEVICE inline float scale_from_amax(float amax, float scaled_max, float fallback) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return fallback;
  const float scale = scaled_max / amax;
  return scale > FLT_MAX ? FLT_MAX : scale;
}

// Whether a cast with `scale` saturated the tensor whose amax it measured: its largest product lay
// beyond `bound`, fp8_max plus half an ulp, past which a wider format would have rounded it to a
// larger value (an infinite amax included, a NaN one not).
MT_HOST_DEVICE inline bool saturated(float amax, float scale, float bound) { return amax * scale > bound; }

// ---- casts ----
// x contiguous (f64/f32/f16/bf16); scale f32 [1]; out fp8 with x's numel, or undefined; out_t fp8
// [K, M] for a 2-D x [M, K] (its transpose), or undefined; neither: the amax alone. amax f32 [1],
// overwritten with max |x|.
void quantize_cpu(const Tensor& x, const Tensor& scale, const Tensor& out, const Tensor& out_t, const Tensor& amax);
void quantize_cuda(const Tensor& x, const Tensor& scale, const Tensor& out, const Tensor& out_t, const Tensor& amax);

// out = q / scale, elementwise; q and out contiguous with q's numel.
void dequantize_cpu(const Tensor& q, const Tensor& scale, const Tensor& out);
void dequantize_cuda(const Tensor& q, const Tensor& scale, const Tensor& out);

// ---- scaling ----
struct DelayedUpdate {
  Tensor history;    // f32 [L], contiguous
  Tensor scale;      // f32 [1]
  Tensor scale_inv;  // f32 [1]
  Tensor new_amax;   // f32 [1]
  Tensor overflows;  // i64 [1]: incremented when new_amax saturated the cast made with `scale`
  bool most_recent = false;
  float scaled_max = 0;        // fp8_max * 2^-margin
  float saturation_bound = 0;  // fp8_max plus half its ulp (saturated)
};
void delayed_update_cpu(const DelayedUpdate& u);
void delayed_update_cuda(const DelayedUpdate& u);

// scale, scale_inv (f32 [1]) from amax (f32 [1]), 1 when amax carries no information.
void current_scale_cpu(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, float scaled_max);
void current_scale_cuda(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, float scaled_max);

// The bias gradient of an FP8 layer: the column sums of dy [M, N] (any floating dtype) as f32 [N],
// accumulated in f32. On CUDA the reduction's column kernel reads dy once in its own dtype (a
// widened copy of dy first would write and read it again at 4 bytes an element, per layer).
Tensor column_sums_f32(const Tensor& dy);

// ---- GEMM ----
// What fp8_gemm and fp8_rowwise_gemm both require of their operands (throws naming `op`): a_q
// [M, K] and b_q [N, K] FP8 on one device, not both f8e5m2, M, N and K multiples of 16; out_dtype
// bf16 or f32; bias bf16 [N] or undefined; Fp8Compute::native only where fp8_native_available.
void check_fp8_gemm(const char* op, const Tensor& a_q, const Tensor& b_q, DType out_dtype, const Tensor& bias,
                    Fp8Compute compute);

// out [M, N] = (a [M, K] * scale_inv_a) (b [N, K] * scale_inv_b)^T + bias through cuBLASLt's FP8
// kernels; every tensor contiguous, 16-byte aligned and validated by fp8_gemm. When amax is
// defined it is written with max |out| if cuBLASLt's epilogue computes it; returns whether it did.
struct Fp8GemmProblem {
  Tensor a, b;                      // fp8, [M, K] and [N, K]
  Tensor scale_inv_a, scale_inv_b;  // f32 [1]
  Tensor out;                       // bf16 or f32 [M, N]
  Tensor bias;                      // bf16 [N] or undefined
  Tensor amax;                      // f32 [1] or undefined
};
bool fp8_gemm_cuda(const Fp8GemmProblem& p);

}  // namespace mt::ops
