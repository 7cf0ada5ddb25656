// FP8 casts with per-tensor scales, and FP8 GEMMs: E4M3 (fn) for activations and weights, E5M2 for
// gradients (Micikevicius et al. 2022, "FP8 formats for deep learning"; Transformer Engine's
// "hybrid" recipe). Scale factors come from ops/fp8/fp8_scaling.h.
//
// Conventions. A scale multiplies on the way in and divides on the way out:
//   q = fp8(x * scale)        x * scale rounded in f32, then to the format by Note [Conversion
//                             rule] (core/float_types.h): nearest even, saturating to +-448 (E4M3)
//                             or +-57344 (E5M2), infinities included; a NaN x gives the
//                             format's NaN with x's sign (E5M2 also keeps what fits of its
//                             payload), the same bits on every device.
//   x ~ q / scale = q * scale_inv.
// Scales, their inverses and amaxes are f32 [1] tensors on the data's device, read and written by
// kernels only: nothing here waits for the device, so every call may sit inside a CUDA Graph
// capture. The amax is max |x| taken before scaling; a NaN anywhere makes it NaN.
//
// Layout: row-major. A GEMM reads both FP8 operands K-major (y = a b^T with a [M, K], b [N, K]),
// the one layout cuBLASLt's FP8 kernels take on sm_89/sm_90; quantize_fp8(..., transposed) writes
// the [K, M] copy that the backward GEMMs need in that layout, in the same pass as the cast.
//
// Nothing here records autograd history (these are the primitives an FP8 Linear is built from).
#pragma once

#include "core/tensor.h"

namespace mt {

// What quantize_fp8 writes for x [M, K]: x's own layout, its transpose [K, M] (contiguous), or
// both from the one pass (a linear layer's x and dy: one copy for the forward or input-gradient
// GEMM, the other for the weight gradient's).
enum class Fp8Layout { as_is, transposed, both };

struct Fp8Quantized {
  Tensor data;    // f8e4m3 / f8e5m2: x's shape (as_is, both), or [K, M] for x [M, K] (transposed)
  Tensor amax;    // f32 [1] on x's device: max |x| before scaling (NaN if x holds one)
  Tensor data_t;  // both: the [K, M] transpose beside `data`; otherwise undefined
};

// The format's largest finite value: 448 (f8e4m3) or 57344 (f8e5m2); any other dtype throws.
float fp8_max(DType format);

// x: f64/f32/f16/bf16, any shape (2-D for `transposed`); scale: f32 with one element on x's
// device; format: f8e4m3 or f8e5m2. One pass over x on CUDA (cast, transpose and amax; with
// Fp8Layout::both both copies come from the tile each block loads, so x is read once).
// An f64 x is rounded to f32 before scaling.
Fp8Quantized quantize_fp8(const Tensor& x, const Tensor& scale, DType format, Fp8Layout layout = Fp8Layout::as_is);

// q / scale in `out` (f64/f32/f16/bf16), q's shape; the division is in f32.
Tensor dequantize_fp8(const Tensor& q, const Tensor& scale, DType out);

// dequantize_fp8(quantize_fp8(x, scale, format).data, scale, x.dtype()): x through the FP8 value
// set, in x's dtype; what FP8 storage does to the numbers, runnable on any device.
Tensor fp8_round_trip(const Tensor& x, const Tensor& scale, DType format);

// max |x| as f32 [1] on x's device (NaN if x holds one): the amax that current (just-in-time)
// scaling needs before the cast.
Tensor fp8_amax(const Tensor& x);

// How fp8_gemm computes: cuBLASLt's FP8 kernels (native: a CUDA GPU of compute capability 8.9 or
// later, else an error), the emulation (emulate: any device), or native where it exists and the
// emulation elsewhere (automatic).
enum class Fp8Compute { automatic, native, emulate };

// Whether `device` runs FP8 GEMMs natively (a CUDA device of compute capability 8.9 or later).
bool fp8_native_available(Device device);

// y = (a_q * scale_inv_a) (b_q * scale_inv_b)^T + bias, accumulated in f32, written as out_dtype.
//   a_q  [M, K] f8e4m3 or f8e5m2     b_q [N, K] f8e4m3 or f8e5m2, not both f8e5m2 (cuBLASLt has
//                                     no E5M2 x E5M2 kernel; a gradient meets a weight or an
//                                     activation, which are E4M3)
//   scale_inv_a, scale_inv_b         f32 with one element each, on the operands' device
//   out_dtype                        bf16 or f32
//   bias [N] bf16, or undefined       (cuBLASLt's FP8 kernels take a bf16 bias for both outputs)
//   y    [M, N] out_dtype
// M, N and K must be multiples of 16 (cuBLASLt's FP8 rule) on every device: the emulation keeps
// the native contract, so code that runs on the CPU runs unchanged on the GPU.
// out_amax, when given, receives max |y| as f32 [1] on the device, taken from the f32 values before
// their rounding to out_dtype: by cuBLASLt's epilogue where it offers one, and by the emulation;
// where cuBLASLt does not offer it for the output type, it is reduced over the written y instead
// (differing by at most out_dtype's rounding).
// Emulation: both operands converted to f32 (exact), the ordinary f32 GEMM, then times
// scale_inv_a * scale_inv_b plus the bias in f32 and one rounding to out_dtype: the same value as
// the native kernel up to the order (and, in the tensor cores, the internal width) of the additions.
Tensor fp8_gemm(const Tensor& a_q, const Tensor& b_q, const Tensor& scale_inv_a, const Tensor& scale_inv_b,
                DType out_dtype, const Tensor& bias = Tensor(), Tensor* out_amax = nullptr,
                Fp8Compute compute = Fp8Compute::automatic);

}  // namespace mt
