// Internal: the one GEMM entry point behind matmul, bmm and linear (forward and
// backward), and the CPU / CUDA kernels it dispatches to.
//
//   gemm(out, a, b, {.transpose_b = Transpose::yes, .beta = 1.0})
//   out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i]    for i < batch
//
// Every operand is a 3-D [batch, rows, cols] view with arbitrary strides; a
// batch stride of 0 (raw::expand of a [1, R, C] tensor) reuses one matrix for
// every batch entry without a copy. gemm() works out, for each operand, a
// layout the BLAS can read (row-major or column-major with a leading
// dimension); an operand with no such layout (no unit stride in either matrix
// dimension) is copied to a contiguous buffer first. The kernels then see a
// GemmProblem whose operands are all readable.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

enum class Transpose { no, yes };

struct GemmArgs {
  Transpose transpose_a = Transpose::no;  // op(a) = a^T: a is [batch, K, M]
  Transpose transpose_b = Transpose::no;  // op(b) = b^T: b is [batch, N, K]
  double alpha = 1.0;
  double beta = 0.0;  // 0: out is written without being read (it may hold garbage)
  // [N] in out's dtype, added to every row of out (beta must be 0). On CUDA it is
  // cuBLASLt's bias epilogue, applied as the tile is stored: no extra pass over out.
  Tensor bias;
  // [M] in out's dtype, written with the row sums of op(a): sum over k of op(a)[i, k]
  // (batch 1, beta 0, no bias). With op(a) = dy^T this is a linear layer's bias
  // gradient beside its weight gradient; on CUDA a column reduction of dy (16-byte reads
  // where dy's rows allow them), in f32 beside bf16/f16 dy (cuBLASLt's BGRADB epilogue does it
  // as a separate kernel, well short of the memory bandwidth).
  Tensor a_row_sums;
  // [batch, M, N] in out's dtype, contiguous: when defined, out = gelu_tanh(product + bias)
  // and this is written with product + bias, the GELU's input, which its backward reads
  // (batch 1, beta 0, a bias, no row sums). On CUDA in f16/bf16 it is cuBLASLt's
  // GELU_AUX_BIAS epilogue: one GEMM writes both, with no separate pass for the GELU.
  // Elsewhere (the CPU, f32, f64, a shape the epilogue cannot serve) the product and bias
  // are written here and out = gelu_tanh(this) by the element-wise loop: the same formula
  // (fn::GeluTanh), so the two agree up to when the pre-activation is rounded (the epilogue
  // applies the GELU to the f32 accumulator plus bias, the loop to the rounded pre-activation).
  Tensor gelu_pre_activation;
  // [1, M, N] in out's dtype, contiguous: when defined, out = product * gelu_tanh'(this), the
  // GELU's backward with this as its input (the pre-activation gelu_pre_activation wrote) and
  // the product as the gradient of its output (batch 1, beta 0, no bias, no row sums). On
  // CUDA in f16/bf16 it is cuBLASLt's DGELU epilogue, which reads this matrix beside the tile
  // it stores: the GEMM writes the pre-activation's gradient with no separate pass. Elsewhere
  // (the CPU, f32, f64, a shape the epilogue cannot serve) out = fn::GeluTanhGrad(product,
  // this) by the element-wise loop, in place, after the plain GEMM: the formula the GELU's own
  // backward runs, so off the epilogue the two are the same computation (on it, the epilogue
  // multiplies the f32 accumulator, not the product rounded to out's dtype).
  Tensor gelu_backward_pre_activation;
};

// out [batch, M, N]: row-major (unit stride along N; batch stride >= M * N unless batch == 1).
// a   [batch or 1, M, K] ([.., K, M] when transposed), batch stride 0 allowed.
// b   [batch or 1, K, N] ([.., N, K] when transposed), batch stride 0 allowed.
// a and b share one floating dtype and one device with out; out has their dtype,
// or f32 when they are f16/bf16 (products accumulated and kept in f32, as a
// gradient summed over several GEMMs wants). out must not overlap a or b.
void gemm(const Tensor& out, const Tensor& a, const Tensor& b, const GemmArgs& args = {});

// ---- what the kernels see ----

enum class Order { row_major, col_major };

// One batched matrix operand [batch, rows, cols] as the BLAS reads it:
// element (i, r, c) is at data + i * batch_stride + (row_major ? r * ld + c : c * ld + r).
struct MatrixOperand {
  Tensor tensor;  // owns the data (a view or a contiguous copy); data_ptr() is matrix 0
  int64_t rows = 0;
  int64_t cols = 0;
  Order order = Order::row_major;
  int64_t ld = 1;            // >= cols (row-major) or >= rows (column-major), and >= 1
  int64_t batch_stride = 0;  // in elements; 0: one matrix for every batch entry
};

// c [batch, m, n] = alpha * a [batch, m, k] @ b [batch, k, n] + beta * c, with
// m, n, k >= 1, batch >= 1 and c row-major.
struct GemmProblem {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  MatrixOperand a, b, c;
  double alpha = 1.0, beta = 0.0;
  Tensor bias;  // CUDA only: [n], c's dtype, contiguous; undefined for none
  // CUDA only, f16/bf16, batch 1, with a bias: [m, n] in c's dtype, row-major with ld = n,
  // n a multiple of 8 and 16-byte aligned (cuBLASLt's rule for the GELU input matrix); c is
  // then written with gelu_tanh(a b + bias) and this with a b + bias. Undefined for none.
  Tensor gelu_pre_activation;
  // CUDA only, f16/bf16, batch 1, no bias: [m, n] in c's dtype, laid out as
  // gelu_pre_activation is (the GELU input matrix's rule again); c is then written with
  // (a b) * gelu_tanh'(this). Undefined for none.
  Tensor gelu_backward_pre_activation;
};

void gemm_cpu(const GemmProblem& p);
// Returns false, having written nothing, when an optional epilogue (gelu_pre_activation
// or gelu_backward_pre_activation) was asked for and cuBLASLt has no
// algorithm with it for this problem; gemm() then runs the plain GEMM and does the
// epilogue's work itself.
bool gemm_cuda(const GemmProblem& p);

}  // namespace mt::ops
