// Internal: the one GEMM entry point behind matmul, bmm and linear (forward and
// backward), and the CPU / CUDA kernels it dispatches to.
//
//   gemm(out, a, b, {.transpose_b = Transpose::yes, .beta = 1.0})
//   out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i]    for i < batch
//   gemm(out, a, b, {.epilogue = GemmEpilogue::bias_gelu(bias, pre)})  (see Epilogue)
//
// Every operand is a 3-D [batch, rows, cols] view with arbitrary strides; a
// batch stride of 0 (raw::expand of a [1, R, C] tensor) reuses one matrix for
// every batch entry without a copy. gemm() works out, for each operand, a
// layout the BLAS can read (row-major or column-major with a leading
// dimension); an operand with no such layout (no unit stride in either matrix
// dimension) is copied to a contiguous buffer first. The kernels then see a
// GemmProblem whose operands are all readable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace mt::ops {

enum class Transpose { no, yes };

// What gemm() does with the product (alpha * op(a) @ op(b)) as it writes out: one epilogue,
// chosen by name with the tensors it needs (GemmEpilogue's constructors), so that only these
// combinations can be asked for. Every epilogue but none writes out without reading it (beta 0).
enum class Epilogue {
  none,           // out = product + beta * out
  bias,           // out = product + bias
  bias_gelu,      // pre = product + bias, out = gelu_tanh(pre)
  gelu_backward,  // out = product * gelu_tanh'(pre)
  row_sums,       // out = product, and the row sums of op(a) beside it
};

class GemmEpilogue {
 public:
  GemmEpilogue() = default;  // Epilogue::none

  // bias [N] in out's dtype, added to every row of out (any batch). On CUDA it is cuBLASLt's
  // bias epilogue, applied as the tile is stored: no extra pass over out.
  static GemmEpilogue bias(Tensor bias) { return GemmEpilogue(Epilogue::bias, std::move(bias), Tensor(), Tensor()); }

  // bias [N] as above; pre_activation [1, M, N] in out's dtype, contiguous (batch 1): out =
  // gelu_tanh(product + bias) and pre_activation is written with product + bias, the GELU's
  // input, which its backward reads. On CUDA in f16/bf16 it is cuBLASLt's GELU_AUX_BIAS
  // epilogue: one GEMM writes both, with no separate pass for the GELU. Elsewhere (the CPU,
  // f32, f64, a shape the epilogue cannot serve) the product and bias are written to
  // pre_activation and out = gelu_tanh(pre_activation) by the element-wise loop: the same formula
  // (fn::GeluTanh), so the two agree up to when the pre-activation is rounded (the epilogue
  // applies the GELU to the f32 accumulator plus bias, the loop to the rounded pre-activation).
  static GemmEpilogue bias_gelu(Tensor bias, Tensor pre_activation) {
    return GemmEpilogue(Epilogue::bias_gelu, std::move(bias), std::move(pre_activation), Tensor());
  }

  // pre_activation [1, M, N] in out's dtype, contiguous (batch 1): out = product *
  // gelu_tanh'(pre_activation), the GELU's backward with the pre-activation bias_gelu wrote as
  // its input and the product as the gradient of its output. On CUDA in f16/bf16 it is
  // cuBLASLt's DGELU epilogue, which reads pre_activation beside the tile it stores: the GEMM
  // writes the pre-activation's gradient with no separate pass. Elsewhere (the CPU, f32, f64, a
  // shape the epilogue cannot serve) out = fn::GeluTanhGrad(product, pre_activation) by the
  // element-wise loop, in place, after the plain GEMM: the formula the GELU's own backward runs,
  // so off the epilogue the two are the same computation (on it, the epilogue multiplies the
  // f32 accumulator, not the product rounded to out's dtype).
  static GemmEpilogue gelu_backward(Tensor pre_activation) {
    return GemmEpilogue(Epilogue::gelu_backward, Tensor(), std::move(pre_activation), Tensor());
  }

  // a_row_sums [M] in out's dtype, contiguous (batch 1): written with the row sums of op(a), the
  // sum over k of op(a)[i, k]. With op(a) = dy^T this is a linear layer's bias gradient beside
  // its weight gradient; on CUDA a column reduction of dy (16-byte reads where dy's rows allow
  // them), in f32 beside bf16/f16 dy (cuBLASLt's BGRADB epilogue does it as a separate kernel,
  // well short of the memory bandwidth).
  static GemmEpilogue row_sums(Tensor a_row_sums) {
    return GemmEpilogue(Epilogue::row_sums, Tensor(), Tensor(), std::move(a_row_sums));
  }

  Epilogue kind() const { return kind_; }
  const Tensor& bias_vector() const { return bias_; }     // bias, bias_gelu; else undefined
  const Tensor& pre_activation() const { return pre_; }   // bias_gelu, gelu_backward; else undefined
  const Tensor& a_row_sums() const { return row_sums_; }  // row_sums; else undefined

 private:
  GemmEpilogue(Epilogue kind, Tensor bias, Tensor pre, Tensor row_sums)
      : kind_(kind), bias_(std::move(bias)), pre_(std::move(pre)), row_sums_(std::move(row_sums)) {
    MT_INTERNAL_ASSERT((kind_ != Epilogue::bias && kind_ != Epilogue::bias_gelu) || bias_.defined(),
                       "gemm: an epilogue with a bias needs a bias vector");
    MT_INTERNAL_ASSERT((kind_ != Epilogue::bias_gelu && kind_ != Epilogue::gelu_backward) || pre_.defined(),
                       "gemm: a GELU epilogue needs its pre-activation");
    MT_INTERNAL_ASSERT(kind_ != Epilogue::row_sums || row_sums_.defined(), "gemm: the row sums need a target");
  }

  Epilogue kind_ = Epilogue::none;
  Tensor bias_;      // [N]
  Tensor pre_;       // [1, M, N]
  Tensor row_sums_;  // [M]
};

struct GemmArgs {
  Transpose transpose_a = Transpose::no;  // op(a) = a^T: a is [batch, K, M]
  Transpose transpose_b = Transpose::no;  // op(b) = b^T: b is [batch, N, K]
  double alpha = 1.0;
  double beta = 0.0;      // 0: out is written without being read (it may hold garbage)
  GemmEpilogue epilogue;  // none unless asked for; any other needs beta 0
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
  // What the kernel applies as it stores c: none (the CPU kernels apply nothing: gemm() does
  // each epilogue's work around them), or on CUDA bias, bias_gelu or gelu_backward (never
  // row_sums, a reduction gemm() runs beside the GEMM). The bias: [n], c's dtype, contiguous,
  // 16-byte aligned. The GELU's pre-activation (bias_gelu writes it with a b + bias and c with
  // gelu_tanh of that; gelu_backward reads it and writes c with (a b) * gelu_tanh'(it)): f16/bf16,
  // batch 1, [m, n] in c's dtype, row-major with ld = n, n a multiple of 8 and 16-byte aligned
  // (cuBLASLt's rule for the GELU input matrix).
  GemmEpilogue epilogue;
};

void gemm_cpu(const GemmProblem& p);
// Returns false, having written nothing, when a GELU epilogue (bias_gelu or gelu_backward)
// was asked for and cuBLASLt has no algorithm with it for this problem; gemm() then runs the
// plain GEMM and does the epilogue's work itself.
bool gemm_cuda(const GemmProblem& p);

// The cuBLASLt state gemm_cuda keeps, for the other cuBLASLt callers (ops/fp8): the handle of
// `device` (a cublasLtHandle_t, created on first use and kept for the process) and the workspace of
// (device, its current stream), 256-byte aligned, of cublaslt_workspace_bytes() bytes. One
// workspace per stream serves every GEMM on it, as stream order keeps them apart.
void* cublaslt_handle(int device);
void* cublaslt_workspace(int device);
size_t cublaslt_workspace_bytes();

}  // namespace mt::ops
