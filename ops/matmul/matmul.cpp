// Matrix products: validation at the boundary, the shared GEMM entry point, and
// the backward of each op written right after its forward.
#include "ops/matmul/matmul.h"
#include "autograd/autocast.h"

#include <algorithm>
#include <utility>

#include "autograd/anomaly.h"
#include "autograd/function.h"
#include "ops/common.h"
#include "ops/elementwise/elementwise.h"
#include "ops/elementwise/functors.h"
#include "ops/map.h"
#include "ops/matmul/lora_branch.h"
#include "ops/matmul/matmul_kernels.h"
#include "ops/reduction/reduction.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt {

// ---- the GEMM entry point ----

namespace ops {
namespace {

// How the BLAS can read the matrix dims (1, 2) of t: rows contiguous
// (row-major, ld = row stride) or columns contiguous (column-major, ld = column
// stride). A dimension of size 1 places no constraint on its stride.
bool blas_layout(const Tensor& t, Order* order, int64_t* ld) {
  const int64_t rows = t.size(1), cols = t.size(2), rs = t.stride(1), cs = t.stride(2);
  if (cs == 1 || cols == 1) {
    const int64_t l = rows == 1 ? std::max<int64_t>(cols, 1) : rs;
    if (l >= std::max<int64_t>(cols, 1)) {
      *order = Order::row_major;
      *ld = l;
      return true;
    }
  }
  if (rs == 1 || rows == 1) {
    const int64_t l = cols == 1 ? std::max<int64_t>(rows, 1) : cs;
    if (l >= std::max<int64_t>(rows, 1)) {
      *order = Order::col_major;
      *ld = l;
      return true;
    }
  }
  return false;
}

// t [batch or 1, R, C] as a readable operand; copied to a contiguous buffer when
// its matrix strides leave no unit stride to read along (a matrix shared by the
// whole batch is copied once, not once per batch entry).
MatrixOperand make_operand(const Tensor& t, int64_t batch) {
  MatrixOperand op;
  op.rows = t.size(1);
  op.cols = t.size(2);
  const bool shared = batch == 1 || t.size(0) == 1 || t.stride(0) == 0;
  op.tensor = t;
  if (!blas_layout(t, &op.order, &op.ld)) {
    op.tensor = raw::contiguous(shared ? raw::narrow(t, 0, 0, 1) : t);
    const bool readable = blas_layout(op.tensor, &op.order, &op.ld);
    MT_INTERNAL_ASSERT(readable, "gemm: a contiguous copy must be readable");
  }
  op.batch_stride = shared ? 0 : op.tensor.stride(0);
  return op;
}

// out [batch, M, N] as the GEMM's row-major output operand.
MatrixOperand output_operand(const Tensor& out) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2);
  MatrixOperand c;
  c.tensor = out;
  c.rows = m;
  c.cols = n;
  c.order = Order::row_major;
  c.ld = m == 1 ? n : out.stride(1);
  c.batch_stride = batch == 1 ? 0 : out.stride(0);
  MT_INTERNAL_ASSERT(
      (out.stride(2) == 1 || n == 1) && c.ld >= n && (batch == 1 || c.batch_stride >= (m - 1) * c.ld + n),
      "gemm: the output must be row-major and non-overlapping, got strides ", shape_str(out.strides()), " for ",
      describe(out));
  return c;
}

}  // namespace

void gemm(const Tensor& out, const Tensor& a_in, const Tensor& b_in, const GemmArgs& args) {
  MT_INTERNAL_ASSERT(out.dim() == 3 && a_in.dim() == 3 && b_in.dim() == 3, "gemm: operands must be 3-D, got ",
                     describe(out), ", ", describe(a_in), ", ", describe(b_in));
  const bool half_in = is_half(a_in.dtype());
  const bool wide_out = out.dtype() == DType::f32 && half_in;  // f16/bf16 products kept in f32
  MT_INTERNAL_ASSERT(a_in.dtype() == b_in.dtype() && (a_in.dtype() == out.dtype() || wide_out) &&
                         a_in.device() == out.device() && b_in.device() == out.device(),
                     "gemm: dtype/device mismatch: ", describe(out), ", ", describe(a_in), ", ", describe(b_in));
  // cuBLASLt writes an f32 C from f16/bf16 A and B itself; the CPU kernels take
  // one dtype, so there the inputs are widened first (exactly, as they widen anyway).
  const bool widen_inputs = wide_out && !out.is_cuda();
  const Tensor a_typed = widen_inputs ? as_dtype(a_in, DType::f32) : a_in;
  const Tensor b_typed = widen_inputs ? as_dtype(b_in, DType::f32) : b_in;
  // A transposed operand is a transposed view: the layout analysis below picks
  // the BLAS transpose flag from its strides.
  const Tensor a = args.transpose_a == Transpose::yes ? raw::transpose(a_typed, 1, 2) : a_typed;
  const Tensor b = args.transpose_b == Transpose::yes ? raw::transpose(b_typed, 1, 2) : b_typed;
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  MT_INTERNAL_ASSERT(a.size(1) == m && b.size(1) == k && b.size(2) == n && (a.size(0) == batch || a.size(0) == 1) &&
                         (b.size(0) == batch || b.size(0) == 1),
                     "gemm: shapes do not match: out ", describe(out), ", op(a) ", describe(a), ", op(b) ",
                     describe(b));
  // The epilogue's operands, checked against out here; each is defined only for the
  // epilogues that take it (GemmEpilogue), which is what the code below goes by.
  const GemmEpilogue& epilogue = args.epilogue;
  const Tensor& bias = epilogue.bias_vector();     // bias, bias_gelu: [N]
  const Tensor& pre = epilogue.pre_activation();   // bias_gelu writes it, gelu_backward reads it
  const Tensor& row_sums = epilogue.a_row_sums();  // row_sums: [M]
  const auto check_bias = [&] {
    MT_INTERNAL_ASSERT(
        bias.dim() == 1 && bias.size(0) == n && bias.dtype() == out.dtype() && bias.device() == out.device(),
        "gemm: bias ", describe(bias), " for out ", describe(out));
  };
  const auto check_pre = [&] {
    MT_INTERNAL_ASSERT(batch == 1 && pre.shape() == out.shape() && pre.dtype() == out.dtype() &&
                           pre.device() == out.device() && pre.is_contiguous(),
                       "gemm: GELU pre-activation ", describe(pre), " for out ", describe(out));
  };
  MT_INTERNAL_ASSERT(epilogue.kind() == Epilogue::none || args.beta == 0.0,
                     "gemm: an epilogue writes out without reading it, got beta ", args.beta);
  switch (epilogue.kind()) {
    case Epilogue::none:
      break;
    case Epilogue::bias:
      check_bias();
      break;
    case Epilogue::bias_gelu:
      check_bias();
      check_pre();
      break;
    case Epilogue::gelu_backward:
      check_pre();
      break;
    case Epilogue::row_sums:
      MT_INTERNAL_ASSERT(batch == 1 && row_sums.dim() == 1 && row_sums.size(0) == m &&
                             row_sums.dtype() == out.dtype() && row_sums.device() == out.device() &&
                             row_sums.is_contiguous(),
                         "gemm: row sums ", describe(row_sums), " for out ", describe(out));
      break;
  }
  const bool with_gelu = epilogue.kind() == Epilogue::bias_gelu;
  const bool with_gelu_grad = epilogue.kind() == Epilogue::gelu_backward;
  // The row sums of op(a) by a reduction. On CUDA straight into the target (f32 beside half
  // operands), by the packed column kernel when op(a) is dy^T: cuBLASLt's BGRADB epilogue runs as
  // a separate kernel over dy, well short of the memory bandwidth, once per linear layer.
  const auto reduce_row_sums = [&] {
    if (!row_sums.defined()) return;
    NoGradGuard no_grad;
    Tensor target = row_sums;
    const Tensor rows_of_a = raw::narrow(a, 0, 0, 1);  // op(a)'s first matrix [1, M, K], summed over K
    // A wider target only by the column kernel: op(a)'s rows at unit stride (dy^T).
    const bool columns = m >= 2 && k >= 2 && rows_of_a.stride(1) == 1;
    const bool direct =
        target.dtype() == a.dtype() || (columns && target.dtype() == DType::f32 && a.dtype() != DType::f64);
    if (target.is_cuda() && direct) {
#if MT_WITH_CUDA
      reduce_cuda(target, rows_of_a, m, k, ReduceKind::sum);
#else
      throw_no_cuda("matmul");
#endif
    } else {  // widened first: a half sum would round an f32 target's values to half
      target.copy_(sum(as_dtype(rows_of_a, target.dtype()), {0, 2}));
    }
  };
  // The GELU by the element-wise loop, from the pre-activation the GEMM wrote: on the CPU,
  // and wherever the epilogue cannot serve. fn::GeluTanh is the formula gelu() runs too.
  const auto apply_gelu = [&] { run_unary(out, pre, "gelu", fn::GeluTanh{}); };
  // The GELU's derivative by the element-wise loop, in place over the product the GEMM wrote:
  // on the CPU, and wherever the epilogue cannot serve. fn::GeluTanhGrad is what gelu()'s
  // backward runs, (gradient, input) -> gradient * gelu_tanh'(input).
  const auto apply_gelu_grad = [&] { run_binary(out, out, pre, "gelu", fn::GeluTanhGrad{}); };
  if (out.numel() == 0) {
    reduce_row_sums();
    return;
  }
  if (k == 0) {  // an empty sum: out = beta * out (or the bias, or the GELU of the bias)
    reduce_row_sums();
    Tensor target = with_gelu ? pre : out;
    if (bias.defined()) {
      target.copy_(raw::expand(bias, out.shape()));
    } else if (args.beta == 0.0) {
      target.zero_();
    } else if (args.beta != 1.0) {
      NoGradGuard no_grad;
      target.copy_(mul(out, args.beta));
    }
    if (with_gelu) apply_gelu();
    if (with_gelu_grad) apply_gelu_grad();
    return;
  }

  GemmProblem p;
  // The epilogue writes the pre-activation beside out when cuBLASLt's rules for it hold
  // (ld a multiple of 8 elements, a 16-byte aligned matrix), in f16/bf16 only: cuBLASLt does
  // not document how accurately its epilogue computes the GELU, and f32 is held to f32
  // accuracy while f16/bf16 round far more coarsely. Otherwise the product and bias go to
  // the pre-activation and the GELU is a second pass. The GELU's derivative likewise, by the
  // DGELU epilogue reading the pre-activation under the same rules (f16/bf16 for the same
  // reason); otherwise a second pass over out.
  const bool fused_gelu = (with_gelu || with_gelu_grad) && out.is_cuda() && is_half(out.dtype()) && n % 8 == 0 &&
                          reinterpret_cast<uintptr_t>(pre.data_ptr()) % 16 == 0;
  // Where the product (and bias) is written: out, or the pre-activation when the GELU comes after.
  const Tensor product_out = with_gelu && !fused_gelu ? pre : out;
  // What the CUDA kernel applies without the GELU (its bias, if any); the CPU kernels apply
  // nothing, accumulating onto a copy of the bias instead.
  GemmEpilogue plain;
  if (bias.defined()) {
    if (out.is_cuda()) {
      // cuBLASLt's bias epilogue wants a 16-byte aligned vector; a view at an odd offset gets a copy.
      const Tensor contiguous = raw::contiguous(bias);
      plain = GemmEpilogue::bias(reinterpret_cast<uintptr_t>(contiguous.data_ptr()) % 16 == 0 ? contiguous
                                                                                              : raw::clone(contiguous));
    } else {
      Tensor target = product_out;
      target.copy_(raw::expand(bias, out.shape()));
    }
  }
  if (!fused_gelu) {
    p.epilogue = plain;
  } else if (with_gelu) {
    p.epilogue = GemmEpilogue::bias_gelu(plain.bias_vector(), pre);
  } else {
    p.epilogue = GemmEpilogue::gelu_backward(pre);
  }
  const double beta = bias.defined() && !out.is_cuda() ? 1.0 : args.beta;
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.alpha = args.alpha;
  p.beta = beta;
  p.a = make_operand(a, batch);
  p.b = make_operand(b, batch);
  p.c = output_operand(product_out);
  // Whether p's GELU epilogue (the GELU or its derivative) ran in the GEMM.
  bool epilogue_ran = false;
  if (out.is_cuda()) {
#if MT_WITH_CUDA
    if (gemm_cuda(p)) {
      epilogue_ran = fused_gelu;
    } else {
      // No algorithm with that epilogue: the plain GEMM (its bias still in the epilogue), then
      // the epilogue's work below.
      GemmProblem without_gelu = p;
      without_gelu.epilogue = plain;
      if (with_gelu) without_gelu.c = output_operand(pre);
      const bool written = gemm_cuda(without_gelu);
      MT_INTERNAL_ASSERT(written, "gemm: a GEMM without a GELU epilogue must always run");
    }
#else
    throw_no_cuda("matmul");
#endif
  } else {
    gemm_cpu(p);
  }
  reduce_row_sums();
  if (with_gelu && !epilogue_ran) apply_gelu();
  if (with_gelu_grad && !epilogue_ran) apply_gelu_grad();
}

}  // namespace ops

using autograd::LambdaNode;
using ops::GemmArgs;
using ops::GemmEpilogue;
using ops::Transpose;

namespace {

Shape batch_dims(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

Shape concat(Shape head, std::initializer_list<int64_t> tail) {
  head.insert(head.end(), tail);
  return head;
}

// t [batch'..., R, C] broadcast to `batch` and seen as [B, R, C] with a single
// batch stride (0 for a broadcast matrix). Batch dims that no single stride can
// describe (a partial broadcast such as [2, 1] -> [2, 3]) are materialised.
Tensor as_batched_3d(const Tensor& t, const Shape& batch) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  Tensor e = raw::expand(t, concat(batch, {rows, cols}));
  int64_t size = 1, stride = 0;
  bool single = true;
  for (size_t i = 0; i < batch.size() && single; ++i) {
    if (batch[i] == 1) continue;
    if (size == 1) {
      size = batch[i];
      stride = e.stride(static_cast<int64_t>(i));
    } else if (stride == e.stride(static_cast<int64_t>(i)) * batch[i]) {
      size *= batch[i];
      stride = e.stride(static_cast<int64_t>(i));
    } else {
      single = false;
    }
  }
  if (!single) {
    e = raw::contiguous(e);
    stride = rows * cols;
  }
  return raw::as_strided(e, {shape_numel(batch), rows, cols}, {stride, e.stride(-2), e.stride(-1)}, e.offset());
}

// op(x) @ op(y) with NumPy batch broadcasting, no recording. x, y are >= 2-D and
// share a dtype and device; op(x) is [bx..., M, K], op(y) [by..., K, N].
// Returns [broadcast(bx, by)..., M, N].
Tensor product(const Tensor& x, Transpose tx, const Tensor& y, Transpose ty) {
  const bool xt = tx == Transpose::yes, yt = ty == Transpose::yes;
  const int64_t m = xt ? x.size(-1) : x.size(-2), k = xt ? x.size(-2) : x.size(-1);
  const int64_t n = yt ? y.size(-2) : y.size(-1);
  const TensorOptions options = ops::options_of(x);
  GemmArgs args;
  args.transpose_a = tx;
  args.transpose_b = ty;
  if (y.dim() == 2 && x.dim() > 2 && !xt) {
    // A batch of x against one matrix y: fold the batch into M, one GEMM.
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    const int64_t rows = shape_numel(out_shape);
    out_shape.push_back(n);
    Tensor out = empty(out_shape, options);
    ops::gemm(raw::view(out, {1, rows, n}), raw::reshape(x, {1, rows, k}), raw::unsqueeze(y, 0), args);
    return out;
  }
  const Shape batch = raw::broadcast_shapes(batch_dims(x), batch_dims(y), "matmul");
  Tensor out = empty(concat(batch, {m, n}), options);
  ops::gemm(raw::view(out, {shape_numel(batch), m, n}), as_batched_3d(x, batch), as_batched_3d(y, batch), args);
  return out;
}

// ---- matmul and bmm ----

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  ops::check_floating(op, a);
  ops::check_floating(op, b);
  ops::check_same_device(op, a, b);
}

[[noreturn]] void throw_mismatch(const char* op, const Tensor& a, const Tensor& b, const std::string& why) {
  throw ShapeError(detail::str_cat(op, ": shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
                                   " cannot be multiplied (", why, ")"));
}

// Shared by matmul and bmm once their shapes are validated: a [..., M, K] (or
// [K]) @ b [..., K, N] (or [K]), with the promoted dtype, and its backward.
Tensor matmul_recorded(const char* node_name, const Tensor& a, const Tensor& b) {
  const DType dtype = promote_types(a.dtype(), b.dtype());
  const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  // [K] @ ... is [1, K] @ ...; ... @ [K] is ... @ [K, 1]; the unit dim is dropped after.
  const Tensor a2 = a_vec ? raw::unsqueeze(ops::as_dtype(a, dtype), 0) : ops::as_dtype(a, dtype);
  const Tensor b2 = b_vec ? raw::unsqueeze(ops::as_dtype(b, dtype), 1) : ops::as_dtype(b, dtype);
  const Tensor out2 = product(a2, Transpose::no, b2, Transpose::no);
  Shape out_shape = out2.shape();
  if (b_vec) out_shape.erase(out_shape.end() - 1);                // N
  if (a_vec) out_shape.erase(out_shape.end() - (b_vec ? 1 : 2));  // M
  const Tensor out = raw::view(out2, out_shape);

  if (autograd::needs_grad({a, b})) {
    const Shape a2_shape = a2.shape(), b2_shape = b2.shape(), out2_shape = out2.shape();
    auto node = std::make_shared<LambdaNode>(node_name, [a_vec, b_vec, a2_shape, b2_shape, out2_shape](
                                                            const std::vector<Tensor>& g, const LambdaNode& self) {
      const Tensor g2 = raw::reshape(g[0], out2_shape);
      const DType dtype = g2.dtype();
      auto as_2d = [](const Tensor& t, bool vec, int64_t dim) { return vec ? raw::unsqueeze(t, dim) : t; };
      Tensor ga, gb;
      if (self.needs_input_grad(0)) {
        // dA = dC B^T, summed over the batch dims A was broadcast along.
        const Tensor bb = as_2d(ops::as_dtype(self.saved_tensor("b"), dtype), b_vec, 1);
        ga = sum_to(product(g2, Transpose::no, bb, Transpose::yes), a2_shape).reshape(self.input_meta[0].shape);
      }
      if (self.needs_input_grad(1)) {
        // dB = A^T dC. A batch of A against a 2-D B folds the batch into K: one GEMM, no sum.
        const Tensor aa = as_2d(ops::as_dtype(self.saved_tensor("a"), dtype), a_vec, 0);
        Tensor full;
        if (b2_shape.size() == 2 && a2_shape.size() > 2) {
          const int64_t rows = shape_numel(Shape(a2_shape.begin(), a2_shape.end() - 1));
          full = product(raw::reshape(aa, {rows, a2_shape.back()}), Transpose::yes,
                         raw::reshape(g2, {rows, out2_shape.back()}), Transpose::no);
        } else {
          full = sum_to(product(aa, Transpose::yes, g2, Transpose::no), b2_shape);
        }
        gb = full.reshape(self.input_meta[1].shape);
      }
      return std::vector<Tensor>{ga, gb};
    });
    // Each input is saved only if the other one needs a gradient.
    if (autograd::requires_grad(b)) node->save("a", a);
    if (autograd::requires_grad(a)) node->save("b", b);
    autograd::record(node, {a, b}, {out});
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const std::vector<Tensor> in = autocast::cast_inputs("matmul", {a_in, b_in});
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  check_pair("matmul", a, b);
  if (a.dim() == 0 || b.dim() == 0) throw_mismatch("matmul", a, b, "both need at least one dimension");
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  if (ka != kb) throw_mismatch("matmul", a, b, detail::str_cat(ka, " != ", kb));
  // The batch dims (all but the last two) must broadcast.
  const Shape ba = a.dim() > 2 ? batch_dims(a) : Shape(), bb = b.dim() > 2 ? batch_dims(b) : Shape();
  for (size_t i = 1; i <= std::min(ba.size(), bb.size()); ++i) {
    const int64_t x = ba[ba.size() - i], y = bb[bb.size() - i];
    if (x != y && x != 1 && y != 1) {
      throw_mismatch("matmul", a, b,
                     detail::str_cat("batch dimensions ", shape_str(ba), " and ", shape_str(bb), " do not broadcast"));
    }
  }
  return matmul_recorded("MatmulBackward", a, b);
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  const std::vector<Tensor> in = autocast::cast_inputs("bmm", {a_in, b_in});
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  check_pair("bmm", a, b);
  if (a.dim() != 3 || b.dim() != 3) throw_mismatch("bmm", a, b, "bmm expects 3-D tensors [B, M, K] and [B, K, N]");
  if (a.size(0) != b.size(0)) {
    throw_mismatch("bmm", a, b, detail::str_cat("batch sizes ", a.size(0), " != ", b.size(0)));
  }
  if (a.size(2) != b.size(1)) throw_mismatch("bmm", a, b, detail::str_cat(a.size(2), " != ", b.size(1)));
  return matmul_recorded("BmmBackward", a, b);
}

// ---- linear ----

namespace {

// What a layer's parameters are called in its errors: mlp_gelu has two layers.
struct ParameterNames {
  const char* weight = "weight";
  const char* bias = "bias";
};

// A weight [out, in] on x's device.
void check_weight(const char* op, const Tensor& x, const Tensor& weight, const char* name) {
  ops::check_floating(op, weight);
  ops::check_same_device(op, x, weight);
  MT_CHECK_T(ShapeError, weight.dim() == 2, op, ": ", name, " must be 2-D [out, in], got ", ops::describe(weight));
}

// A bias [out] for weight [out, in] on x's device, or none; returns dtype promoted with it.
DType check_bias(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, const ParameterNames& names,
                 DType dtype) {
  if (!bias.defined()) return dtype;
  ops::check_floating(op, bias);
  ops::check_same_device(op, x, bias);
  MT_CHECK_T(ShapeError, bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": ", names.bias, " must have shape [",
             weight.size(0), "] to match ", names.weight, " ", shape_str(weight.shape()), ", got ",
             shape_str(bias.shape()));
  return promote_types(dtype, bias.dtype());
}

// For the ops with a GELU: the GEMM's epilogue adds the bias before the GELU, so there must be one.
void require_bias(const char* op, const Tensor& weight, const Tensor& bias, const ParameterNames& names,
                  const char* instead) {
  MT_CHECK(bias.defined(), op, ": ", names.bias, " is an undefined tensor; it must be [", weight.size(0), "] for ",
           names.weight, " ", shape_str(weight.shape()), " (without a bias, ", instead, ")");
}

// linear's checks (also lora_linear's for its base, mlp_gelu's for its first layer); returns
// the promoted dtype.
DType check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const ParameterNames& names = {}) {
  ops::check_floating(op, x);
  check_weight(op, x, weight, names.weight);
  MT_CHECK_T(ShapeError, x.dim() >= 1, op, ": input must have at least one dimension [..., in], got ",
             ops::describe(x));
  MT_CHECK_T(ShapeError, x.size(-1) == weight.size(1), op, ": input ", shape_str(x.shape()), " and ", names.weight, " ",
             shape_str(weight.shape()), " cannot be multiplied (in features: ", x.size(-1), " != ", weight.size(1),
             ")");
  return check_bias(op, x, weight, bias, names, promote_types(x.dtype(), weight.dtype()));
}

// y [1, P, out] = x [P, in] W^T + b, no recording; the bias in the GEMM's epilogue on CUDA.
// With gelu_pre_activation [1, P, out] (and a bias), y = gelu_tanh(x W^T + b) and the
// pre-activation x W^T + b is written there (GemmEpilogue::bias_gelu).
void linear_forward(const Tensor& out3, const Tensor& x, const Tensor& weight, const Tensor& bias, DType dtype,
                    int64_t rows, int64_t in, const Tensor& gelu_pre_activation = Tensor()) {
  GemmArgs args;
  args.transpose_b = Transpose::yes;
  if (gelu_pre_activation.defined()) {
    args.epilogue = GemmEpilogue::bias_gelu(ops::as_dtype(bias, dtype), gelu_pre_activation);
  } else if (bias.defined()) {
    args.epilogue = GemmEpilogue::bias(ops::as_dtype(bias, dtype));
  }
  ops::gemm(out3, raw::reshape(ops::as_dtype(x, dtype), {1, rows, in}), raw::unsqueeze(ops::as_dtype(weight, dtype), 0),
            args);
}

struct LinearGrads {
  Tensor x, weight, bias;
};

// The dtype a GEMM of `operands` operands writes for a gradient wanted in `wanted`: that dtype
// when the GEMM can write it (its operands' own, or f32 from f16/bf16 ones: an autocast
// parameter's f32 gradient straight from the GEMM), else the operands' (the engine converts).
DType gradient_dtype(DType operands, DType wanted) {
  return wanted == operands || (wanted == DType::f32 && is_half(operands)) ? wanted : operands;
}

// The base layer's gradients from dy [P, out]: dx = dy W, dW = dy^T x and db = the row
// sums of dy^T, which gemm() forms beside the dW GEMM (or a reduction when dW is not
// wanted); dW and db in w_dtype / b_dtype (the parameters' own) where gemm() can write them so.
LinearGrads linear_backward(const Tensor& dy, const Tensor& x_saved, const Tensor& w_saved, bool want_x, bool want_w,
                            bool want_b, int64_t in, DType w_dtype, DType b_dtype) {
  const int64_t rows = dy.size(0), out_features = dy.size(1);
  const DType dtype = dy.dtype();
  LinearGrads grads;
  if (want_x) grads.x = product(dy, Transpose::no, ops::as_dtype(w_saved, dtype), Transpose::no);  // [P, in]
  if (want_w) {
    const Tensor xf = raw::reshape(ops::as_dtype(x_saved, dtype), {rows, in});
    const DType dw_dtype = gradient_dtype(dtype, w_dtype);
    grads.weight = empty({out_features, in}, ops::options_of(dy).dtype(dw_dtype));
    GemmArgs args;
    args.transpose_a = Transpose::yes;
    if (want_b && gradient_dtype(dtype, b_dtype) == dw_dtype) {  // the row sums come in dW's dtype
      grads.bias = empty({out_features}, ops::options_of(dy).dtype(dw_dtype));
      args.epilogue = GemmEpilogue::row_sums(grads.bias);
    }
    ops::gemm(raw::unsqueeze(grads.weight, 0), raw::unsqueeze(dy, 0), raw::unsqueeze(xf, 0), args);
  }
  if (want_b && !grads.bias.defined()) grads.bias = sum(dy, {0});  // [out]
  return grads;
}

// The leading dims of x, flattened: the rows of a linear layer's GEMMs.
int64_t leading_rows(const Tensor& x) { return shape_numel(Shape(x.shape().begin(), x.shape().end() - 1)); }

// A linear layer's operands. Under autocast x is cast as any op's input is (a Cast node
// brings its gradient back in its own dtype), while the parameters' low-precision copies
// record nothing: the node records the parameters themselves and its backward writes their
// gradients in their own dtype, an f32 dW straight from the GEMM instead of a bf16 one that
// a Cast node's backward widens in a second pass.
struct LinearOperands {
  Tensor x;             // the input, as recorded and read
  Tensor weight, bias;  // the parameters as given: the node's inputs
  Tensor w, b;          // what the GEMMs read
};

LinearOperands linear_operands(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const std::vector<Tensor> copies = autocast::operand_copies(op, {weight, bias});
  return LinearOperands{autocast::cast_input(op, x), weight, bias, copies[0], copies[1]};
}

// What a node with inputs (x, weight, bias) saves for linear's gradients: x is read only
// for dW, W (its copy) only for dx; each is saved only when that gradient is wanted.
void save_linear_inputs(LambdaNode& node, const LinearOperands& o) {
  if (autograd::requires_grad(o.weight)) node.save("x", o.x);
  if (autograd::requires_grad(o.x)) node.save("weight", o.w);
}

// The gradients of (x, weight, bias) from dy [P, out], for a node that saved its inputs
// with save_linear_inputs: LinearBackward's body, and LinearGeluBackward's after the GELU.
std::vector<Tensor> linear_input_grads(const Tensor& dy, const LambdaNode& self, int64_t in) {
  LinearGrads grads = linear_backward(dy, self.saved_tensor_or_none("x"), self.saved_tensor_or_none("weight"),
                                      self.needs_input_grad(0), self.needs_input_grad(1), self.needs_input_grad(2), in,
                                      self.input_meta[1].dtype, self.input_meta[2].dtype);
  if (grads.x.defined()) grads.x = grads.x.reshape(self.input_meta[0].shape);
  return {grads.x, grads.weight, grads.bias};
}

Shape leading_dims_and(const Tensor& x, int64_t last) {
  Shape shape(x.shape().begin(), x.shape().end() - 1);
  shape.push_back(last);
  return shape;
}

// linear_gelu's forward, h = gelu_tanh(x W^T + b) into h (P rows of out features, any shape
// of that size), in dtype; returns the pre-activation x W^T + b [P, out] written beside it.
// On CUDA in f16/bf16 one GEMM writes both (cuBLASLt's GELU_AUX_BIAS epilogue), applying the
// GELU to the f32 accumulator plus bias; gelu(linear(...)) rounds the pre-activation to the
// output dtype first and applies the GELU to that. The two differ by that one rounding, well
// within the op contract's bf16/f16 tolerances; everywhere else they are the same computation.
Tensor linear_gelu_forward(const Tensor& h, const LinearOperands& o, DType dtype, int64_t p) {
  const int64_t in = o.w.size(1), out_features = o.w.size(0);
  const Tensor pre = empty({p, out_features}, ops::options_of(h));
  linear_forward(raw::view(h, {1, p, out_features}), o.x, o.w, o.b, dtype, p, in, raw::unsqueeze(pre, 0));
  return pre;
}

}  // namespace

// ---- LoRA's branch (ops/matmul/lora_branch.h) ----

namespace ops {

OutputValues values_to_write(OutputValues values) { return detect_anomaly_enabled() ? OutputValues::computed : values; }

Tensor lora_branch_forward(const Tensor& out, const Tensor& h, const Tensor& lora_a, const Tensor& lora_b, double scale,
                           DType dtype, OutputValues values) {
  const int64_t p = out.size(0), in = lora_a.size(1), r = lora_a.size(0);
  const Tensor t = empty({p, r}, TensorOptions().dtype(dtype).device(out.device()));
  linear_forward(raw::unsqueeze(t, 0), h, lora_a, Tensor(), dtype, p, in);
  if (values == OutputValues::unread) return t;
  GemmArgs accumulate;
  accumulate.transpose_b = Transpose::yes;
  accumulate.alpha = scale;
  accumulate.beta = 1.0;
  gemm(raw::unsqueeze(out, 0), raw::unsqueeze(t, 0), raw::unsqueeze(as_dtype(lora_b, dtype), 0), accumulate);
  return t;
}

void save_lora_branch(LambdaNode& node, const Tensor& t, const Tensor& h, const Tensor& lora_a, const Tensor& lora_b,
                      bool want_h, bool want_a, bool want_b) {
  if (want_b) node.save("t", t);
  if (want_a) node.save("h", h);
  if (want_h || want_a) node.save("lora_b", lora_b);
  if (want_h) node.save("lora_a", lora_a);
}

LoraBranchGrads lora_branch_backward(const Tensor& dy, const LambdaNode& self, const LoraBranchWanted& want,
                                     double scale) {
  const int64_t p = dy.size(0), out_features = dy.size(1);
  const DType dtype = dy.dtype();
  const TensorOptions options = options_of(dy);
  LoraBranchGrads grads;
  if (want.b) {  // dB [out, r] = scale dy^T t
    const Tensor t = as_dtype(self.saved_tensor("t"), dtype);
    grads.b = empty({out_features, t.size(1)}, options.dtype(gradient_dtype(dtype, want.b_dtype)));
    GemmArgs args;
    args.transpose_a = Transpose::yes;
    args.alpha = scale;
    gemm(raw::unsqueeze(grads.b, 0), raw::unsqueeze(dy, 0), raw::unsqueeze(t, 0), args);
  }
  if (want.h || want.a || want.h_into.defined()) {
    // dt [P, r] = scale dy B
    const Tensor lora_b = as_dtype(self.saved_tensor("lora_b"), dtype);
    const int64_t r = lora_b.size(1);
    const Tensor dt = empty({p, r}, options);
    GemmArgs args;
    args.alpha = scale;
    gemm(raw::unsqueeze(dt, 0), raw::unsqueeze(dy, 0), raw::unsqueeze(lora_b, 0), args);
    if (want.a) {  // dA [r, in] = dt^T h
      const Tensor h = as_dtype(self.saved_tensor("h"), dtype);
      const int64_t in = h.size(-1);
      grads.a = empty({r, in}, options.dtype(gradient_dtype(dtype, want.a_dtype)));
      GemmArgs dt_transposed;
      dt_transposed.transpose_a = Transpose::yes;
      gemm(raw::unsqueeze(grads.a, 0), raw::unsqueeze(dt, 0), raw::unsqueeze(raw::reshape(h, {p, in}), 0),
           dt_transposed);
    }
    if (want.h_into.defined()) {  // h_into [P, in] += dt A
      GemmArgs add;
      add.beta = 1.0;
      gemm(raw::unsqueeze(want.h_into, 0), raw::unsqueeze(dt, 0),
           raw::unsqueeze(as_dtype(self.saved_tensor("lora_a"), dtype), 0), add);
    }
    if (want.h) {  // dh [P, in] = dt A
      grads.h =
          product(dt, Transpose::no, as_dtype(self.saved_tensor("lora_a"), dtype), Transpose::no).reshape(want.h_shape);
    }
  }
  return grads;
}

}  // namespace ops

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, OutputValues requested) {
  const OutputValues values = ops::values_to_write(requested);
  const LinearOperands o = linear_operands("linear", x_in, weight_in, bias_in);
  const DType dtype = check_linear("linear", o.x, o.w, o.b);
  const int64_t in = o.w.size(1), out_features = o.w.size(0);
  const int64_t p = leading_rows(o.x);
  Tensor out = empty(leading_dims_and(o.x, out_features), TensorOptions().dtype(dtype).device(o.x.device()));
  if (values == OutputValues::computed)
    linear_forward(raw::view(out, {1, p, out_features}), o.x, o.w, o.b, dtype, p, in);

  if (autograd::needs_grad({o.x, o.weight, o.bias})) {
    auto node = std::make_shared<LambdaNode>(
        "LinearBackward", [p, in, out_features](const std::vector<Tensor>& g, const LambdaNode& self) {
          return linear_input_grads(raw::reshape(g[0], {p, out_features}), self, in);  // dy [P, out]
        });
    save_linear_inputs(*node, o);
    autograd::record(node, {o.x, o.weight, o.bias}, {out});
  }
  return out;
}

Tensor linear_gelu(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const LinearOperands o = linear_operands("linear_gelu", x_in, weight_in, bias_in);
  const DType dtype = check_linear("linear_gelu", o.x, o.w, o.b);
  require_bias("linear_gelu", o.w, o.b, {}, "use gelu(linear(x, weight), GeluApproximation::tanh)");
  const int64_t in = o.w.size(1), out_features = o.w.size(0);
  const int64_t p = leading_rows(o.x);
  Tensor out = empty(leading_dims_and(o.x, out_features), TensorOptions().dtype(dtype).device(o.x.device()));  // h
  const Tensor pre = linear_gelu_forward(out, o, dtype, p);  // x W^T + b, the GELU's input

  if (autograd::needs_grad({o.x, o.weight, o.bias})) {
    auto node = std::make_shared<LambdaNode>("LinearGeluBackward", [p, in, out_features](const std::vector<Tensor>& g,
                                                                                         const LambdaNode& self) {
      // dpre = dh * gelu_tanh'(pre) in one element-wise pass, then linear's gradients with dpre as dy.
      const Tensor dh = raw::reshape(g[0], {p, out_features});  // [P, out]
      const Tensor dpre = empty(dh.shape(), ops::options_of(dh));
      ops::run_binary(dpre, dh, ops::as_dtype(self.saved_tensor("pre"), dh.dtype()), "linear_gelu", fn::GeluTanhGrad{});
      return linear_input_grads(dpre, self, in);
    });
    save_linear_inputs(*node, o);
    node->save("pre", pre);  // every gradient goes through the GELU's derivative at pre
    autograd::record(node, {o.x, o.weight, o.bias}, {out});
  }
  return out;
}

Tensor mlp_gelu(const Tensor& x_in, const Tensor& w1_in, const Tensor& b1_in, const Tensor& w2_in,
                const Tensor& b2_in) {
  // The first layer's operands as linear_gelu's; the second's parameter copies likewise
  // unrecorded (LinearOperands): the node records all five inputs as given.
  const LinearOperands o = linear_operands("mlp_gelu", x_in, w1_in, b1_in);
  const std::vector<Tensor> copies = autocast::operand_copies("mlp_gelu", {w2_in, b2_in});
  const Tensor &w2 = copies[0], &b2 = copies[1];
  const ParameterNames first{"w1", "b1"}, second{"w2", "b2"};
  DType dtype = check_linear("mlp_gelu", o.x, o.w, o.b, first);
  require_bias("mlp_gelu", o.w, o.b, first, "compose linear, gelu and linear");
  check_weight("mlp_gelu", o.x, w2, second.weight);
  MT_CHECK_T(ShapeError, w2.size(1) == o.w.size(0), "mlp_gelu: w2 ", shape_str(w2.shape()), " takes ", w2.size(1),
             " in features but w1 ", shape_str(o.w.shape()), " gives ", o.w.size(0),
             " hidden features (w2 must be [out, ", o.w.size(0), "])");
  dtype = check_bias("mlp_gelu", o.x, w2, b2, second, promote_types(dtype, w2.dtype()));
  require_bias("mlp_gelu", w2, b2, second, "compose linear, gelu and linear");
  const int64_t in = o.w.size(1), hidden = o.w.size(0), out_features = w2.size(0);
  const int64_t p = leading_rows(o.x);
  const TensorOptions options = TensorOptions().dtype(dtype).device(o.x.device());
  const Tensor h = empty({p, hidden}, options);            // gelu_tanh(pre)
  const Tensor pre = linear_gelu_forward(h, o, dtype, p);  // x W1^T + b1 [P, hidden]
  Tensor out = empty(leading_dims_and(o.x, out_features), options);
  linear_forward(raw::view(out, {1, p, out_features}), h, w2, b2, dtype, p, hidden);

  const std::vector<Tensor> inputs = {o.x, w1_in, b1_in, w2_in, b2_in};  // what the node records
  if (autograd::needs_grad(inputs)) {
    auto node = std::make_shared<LambdaNode>(
        "MlpGeluBackward", [p, in, hidden, out_features](const std::vector<Tensor>& g, const LambdaNode& self) {
          const Tensor dy = raw::reshape(g[0], {p, out_features});  // [P, out]
          // The second layer: dW2 = dy^T h with db2 beside it; its input gradient is the next step.
          const LinearGrads second_grads =
              linear_backward(dy, self.saved_tensor_or_none("h"), Tensor(), /*want_x=*/false, self.needs_input_grad(3),
                              self.needs_input_grad(4), hidden, self.input_meta[3].dtype, self.input_meta[4].dtype);
          std::vector<Tensor> grads = {Tensor(), Tensor(), Tensor(), second_grads.weight, second_grads.bias};
          if (self.needs_input_grad(0) || self.needs_input_grad(1) || self.needs_input_grad(2)) {
            // dpre [P, hidden] = (dy W2) * gelu_tanh'(pre): on CUDA in f16/bf16 one GEMM whose DGELU
            // epilogue reads pre; elsewhere the GEMM, then the derivative in place.
            const DType dtype = dy.dtype();
            const Tensor dpre = empty({p, hidden}, ops::options_of(dy));
            GemmArgs args;
            args.epilogue =
                GemmEpilogue::gelu_backward(raw::unsqueeze(ops::as_dtype(self.saved_tensor("pre"), dtype), 0));
            ops::gemm(raw::unsqueeze(dpre, 0), raw::unsqueeze(dy, 0),
                      raw::unsqueeze(ops::as_dtype(self.saved_tensor("w2"), dtype), 0), args);
            const std::vector<Tensor> first_grads = linear_input_grads(dpre, self, in);
            std::copy(first_grads.begin(), first_grads.end(), grads.begin());
          }
          return grads;
        });
    // Saved: x (dW1) and W1 (dx) as linear's, then h (dW2), W2 and pre (every gradient of the
    // first layer goes back through dpre).
    save_linear_inputs(*node, o);
    const bool first_layer_grads =
        autograd::requires_grad(o.x) || autograd::requires_grad(w1_in) || autograd::requires_grad(b1_in);
    if (autograd::requires_grad(w2_in)) node->save("h", h);
    if (first_layer_grads) {
      node->save("w2", w2);
      node->save("pre", pre);
    }
    autograd::record(node, inputs, {out});
  }
  return out;
}

namespace {

// dx = dy W in x's shape, for lora_linear's backward: written into `held`, the engine's gradient for
// x so far (a norm's output that q, k and v all read), by the GEMM itself (beta 1) when there is
// one of dy's dtype (Node::apply_adding), instead of a second [P, in] tensor and a separate sum.
Tensor lora_input_grad(const Tensor& dy, const Tensor& weight, const Tensor& held, const Shape& x_shape) {
  const int64_t p = dy.size(0), in = weight.size(1);
  const bool into_held = held.defined() && held.dtype() == dy.dtype() && held.is_contiguous();
  const Tensor dx = into_held ? held : empty(x_shape, ops::options_of(dy));
  GemmArgs args;
  args.beta = into_held ? 1.0 : 0.0;
  ops::gemm(raw::view(dx, {1, p, in}), raw::unsqueeze(dy, 0), raw::unsqueeze(ops::as_dtype(weight, dy.dtype()), 0),
            args);
  return dx;
}

}  // namespace

Tensor lora_linear(const Tensor& x_in, const Tensor& h_in, const Tensor& weight_in, const Tensor& bias_in,
                   const Tensor& a_in, const Tensor& b_in, double scale, OutputValues requested) {
  const OutputValues values = ops::values_to_write(requested);
  // x and h as any op's inputs; the parameters' copies recorded as nothing (LinearOperands).
  const std::vector<Tensor> cast = autocast::cast_inputs("lora_linear", {x_in, h_in});
  const std::vector<Tensor> copies = autocast::operand_copies("lora_linear", {weight_in, bias_in, a_in, b_in});
  const Tensor &x = cast[0], &h = cast[1], &weight = copies[0], &bias = copies[1], &lora_a = copies[2],
               &lora_b = copies[3];
  DType dtype = check_linear("lora_linear", x, weight, bias);
  ops::check_floating("lora_linear", h);
  ops::check_floating("lora_linear", lora_a);
  ops::check_floating("lora_linear", lora_b);
  ops::check_same_device("lora_linear", x, h);
  ops::check_same_device("lora_linear", x, lora_a);
  ops::check_same_device("lora_linear", x, lora_b);
  const int64_t in = weight.size(1), out_features = weight.size(0);
  MT_CHECK_T(ShapeError, h.shape() == x.shape(), "lora_linear: the adapter's input ", ops::describe(h),
             " must have the shape of x ", ops::describe(x));
  MT_CHECK_T(ShapeError, lora_a.dim() == 2 && lora_a.size(1) == in && lora_a.size(0) >= 1,
             "lora_linear: lora_a must be [r, ", in, "] with r >= 1, got ", ops::describe(lora_a));
  const int64_t r = lora_a.size(0);
  MT_CHECK_T(ShapeError, lora_b.dim() == 2 && lora_b.size(0) == out_features && lora_b.size(1) == r,
             "lora_linear: lora_b must be [", out_features, ", ", r, "] for weight ", shape_str(weight.shape()),
             " and lora_a ", shape_str(lora_a.shape()), ", got ", ops::describe(lora_b));
  dtype = promote_types(promote_types(dtype, h.dtype()), promote_types(lora_a.dtype(), lora_b.dtype()));
  const int64_t p = leading_rows(x);
  Tensor out = empty(leading_dims_and(x, out_features), TensorOptions().dtype(dtype).device(x.device()));
  const Tensor out3 = raw::view(out, {1, p, out_features});
  if (values == OutputValues::computed) linear_forward(out3, x, weight, bias, dtype, p, in);
  const Tensor t = ops::lora_branch_forward(raw::view(out, {p, out_features}), h, lora_a, lora_b, scale, dtype, values);

  // An adapter reading x itself records no input of its own: its dh is added into dx by a GEMM.
  const bool h_is_x = ops::adapter_reads_x(x, h);
  const std::vector<Tensor> inputs = {x, h_is_x ? Tensor() : h, weight_in, bias_in, a_in, b_in};  // recorded
  if (autograd::needs_grad(inputs)) {
    auto node = std::make_shared<LambdaNode>(
        "LoraLinearBackward",
        [p, in, out_features, scale, h_is_x](const std::vector<Tensor>& g, const std::vector<Tensor>& sums,
                                             const LambdaNode& self) {
          const Tensor dy = raw::reshape(g[0], {p, out_features});  // [P, out]
          LinearGrads base =
              linear_backward(dy, self.saved_tensor_or_none("x"), Tensor(), /*want_x=*/false, self.needs_input_grad(2),
                              self.needs_input_grad(3), in, self.input_meta[2].dtype, self.input_meta[3].dtype);
          const Tensor dx = self.needs_input_grad(0)
                                ? lora_input_grad(dy, self.saved_tensor("weight"), sums[0], self.input_meta[0].shape)
                                : Tensor();
          ops::LoraBranchWanted want;
          want.h = self.needs_input_grad(1);
          want.a = self.needs_input_grad(4);
          want.b = self.needs_input_grad(5);
          want.h_shape = self.input_meta[1].shape;
          if (h_is_x && dx.defined()) want.h_into = raw::view(dx, {p, in});
          want.a_dtype = self.input_meta[4].dtype;
          want.b_dtype = self.input_meta[5].dtype;
          const ops::LoraBranchGrads branch = ops::lora_branch_backward(dy, self, want, scale);
          return std::vector<Tensor>{dx, branch.h, base.weight, base.bias, branch.a, branch.b};
        });
    // Saved: x (dW), W (dx), and the branch's (t for dB, h for dA, B for dA and dh, A for dh).
    if (autograd::requires_grad(weight_in)) node->save("x", x);
    if (autograd::requires_grad(x)) node->save("weight", weight);
    ops::save_lora_branch(*node, t, h, lora_a, lora_b, autograd::requires_grad(h), autograd::requires_grad(a_in),
                          autograd::requires_grad(b_in));
    autograd::record(node, inputs, {out});
  }
  return out;
}

}  // namespace mt
