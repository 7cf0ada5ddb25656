// Internal: LoRA's low-rank branch, out += scale * (h A^T) B^T, forward and backward, shared by the
// ops whose bases differ: lora_linear (ops/matmul/matmul.h) and fp8_lora_linear (ops/fp8/fp8_rowwise.h).
#pragma once

#include "autograd/function.h"
#include "core/tensor.h"
#include "ops/matmul/matmul.h"

namespace mt::ops {

// t [P, r] = h A^T, then out [P, N] += scale * t B^T by that GEMM itself (alpha scale, beta 1): no
// separate adapter output, scaling or sum. h [..., K] with P rows; lora_a [r, K]; lora_b [N, r];
// every operand read in `dtype`, which out has. Returns t. With OutputValues::unread, t alone.
Tensor lora_branch_forward(const Tensor& out, const Tensor& h, const Tensor& lora_a, const Tensor& lora_b, double scale,
                           DType dtype, OutputValues values);

// Whether a LoRA op's adapter reads its base's input itself (no dropout): the op then records h
// as no input of its own and adds dh into dx (LoraBranchWanted::h_into).
inline bool adapter_reads_x(const Tensor& x, const Tensor& h) { return x.impl_ptr() == h.impl_ptr(); }

// What a LoRA op writes when asked for `values`: an unread output is computed all the same under
// anomaly detection, which reads every output recorded.
OutputValues values_to_write(OutputValues values);

// Saves on `node` what the branch's gradients read, only for those wanted: t for dB, h for dA,
// B for dA and dh (both go through dt = scale dy B), A for dh. want_h: dh is wanted, returned or
// added into x's gradient (LoraBranchWanted::h_into).
void save_lora_branch(autograd::LambdaNode& node, const Tensor& t, const Tensor& h, const Tensor& lora_a,
                      const Tensor& lora_b, bool want_h, bool want_a, bool want_b);

struct LoraBranchWanted {
  bool h = false, a = false, b = false;
  Shape h_shape;  // dh comes in this shape
  // Defined (a [P, K] tensor in dy's dtype): dh = scale dy B A is added into it by its GEMM (beta 1)
  // instead of returned, for a layer whose adapter reads x itself: one gradient for x, not two that
  // the engine would then sum.
  Tensor h_into;
  DType a_dtype = DType::f32;  // dA and dB come in these dtypes where the GEMM can write them so
  DType b_dtype = DType::f32;
};

struct LoraBranchGrads {
  Tensor h, a, b;  // dh, dA [r, K], dB [N, r]; undefined when not wanted
};

// From dy [P, N] (the GEMMs run in its dtype), with the tensors save_lora_branch kept:
// dB = scale dy^T t, dt = scale dy B, dA = dt^T h, dh = dt A (or want.h_into += dt A).
LoraBranchGrads lora_branch_backward(const Tensor& dy, const autograd::LambdaNode& self, const LoraBranchWanted& want,
                                     double scale);

}  // namespace mt::ops
