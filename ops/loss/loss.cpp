// Cross-entropy: validation at the boundary, the fused forward (per-row loss and
// logsumexp, then the reduction), and the backward right after. Logits with
// extra dims [N, C, d1, ...] are permuted to rows [N * d1 * ..., C] (a copy),
// so the kernels only ever see contiguous rows.
#include "ops/loss/loss.h"
#include "autograd/autocast.h"

#include <algorithm>
#include <vector>

#include "autograd/function.h"
#include "core/dispatch.h"
#include "ops/common.h"
#include "ops/loss/loss_kernels.h"
#include "ops/map.h"
#include "ops/matmul/matmul_kernels.h"

namespace mt {

using autograd::LambdaNode;

namespace {

constexpr const char* kOp = "cross_entropy";

DType loss_dtype(DType logits) { return logits == DType::f64 ? DType::f64 : DType::f32; }

// Logits [N, C, d1, ...] as seen by the kernels: permuted to [N, d1, ..., C].
struct ClassLastLayout {
  std::vector<int64_t> order;    // [N, C, d...] -> [N, d..., C]
  std::vector<int64_t> inverse;  // and back
  Shape permuted_shape;          // [N, d1, ..., C]
  int64_t rows = 0;              // N * d1 * ...
  int64_t classes = 0;           // C
};

ClassLastLayout class_last_layout(const Tensor& logits) {
  ClassLastLayout l;
  const int64_t nd = logits.dim();
  l.order.push_back(0);
  for (int64_t i = 2; i < nd; ++i) l.order.push_back(i);
  l.order.push_back(1);
  l.inverse.resize(l.order.size());
  for (size_t i = 0; i < l.order.size(); ++i) l.inverse[static_cast<size_t>(l.order[i])] = static_cast<int64_t>(i);
  for (int64_t d : l.order) l.permuted_shape.push_back(logits.shape()[static_cast<size_t>(d)]);
  l.classes = logits.shape()[1];
  l.rows = logits.numel() / l.classes;
  return l;
}

void validate(const Tensor& logits, const Tensor& target) {
  ops::check_floating(kOp, logits);
  ops::check_defined(kOp, target, "target");
  MT_CHECK_T(DTypeError, target.dtype() == DType::i64 || target.dtype() == DType::i32, kOp,
             ": target must hold class indices of dtype i64 or i32, got ", ops::describe(target));
  ops::check_same_device(kOp, logits, target);
  MT_CHECK_T(ShapeError, logits.dim() >= 2, kOp, ": logits must be [N, C] or [N, C, d1, ...], got ",
             ops::describe(logits), " (target ", ops::describe(target), ")");
  Shape expected = logits.shape();
  expected.erase(expected.begin() + 1);
  MT_CHECK_T(ShapeError, target.shape() == expected, kOp, ": target ", ops::describe(target), " does not match logits ",
             ops::describe(logits), " (expected target shape ", shape_str(expected),
             ": the logits' shape without the class dim 1)");
  MT_CHECK_T(ShapeError, logits.shape()[1] > 0, kOp, ": logits ", ops::describe(logits), " have no classes");
}

// CPU targets are checked here; CUDA ones are not (that would wait for the
// device): out-of-range rows come out NaN instead (see loss.h).
void check_target_values(const Tensor& target, int64_t classes, int64_t ignore_index) {
  dispatch_index(target.dtype(), kOp, [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* t = static_cast<const I*>(target.data_ptr());
    for (int64_t i = 0; i < target.numel(); ++i) {
      const auto v = static_cast<int64_t>(t[i]);
      MT_CHECK(v == ignore_index || (v >= 0 && v < classes), kOp, ": target value ", v, " at flat index ", i,
               " is out of range for ", classes, " classes (expected 0 <= target < ", classes,
               " or target == ignore_index ", ignore_index, ")");
    }
  });
}

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index, Reduction reduction) {
  // Autocast's policy for losses is f32 (autograd/autocast_policy.cpp). The kernels already
  // widen f16/bf16 logits to f32 as they read them and return an f32 loss, so only f32 inputs
  // go through the policy's cast (a no-op for them): casting low-precision logits first would
  // give the same numbers (widening is exact) but an f32 copy of the [N, V] logits, saved for
  // backward, and an f32 gradient of that size too.
  const Tensor logits = is_half(input.dtype()) ? input : autocast::cast_input("cross_entropy", input);
  validate(logits, target);
  const ClassLastLayout layout = class_last_layout(logits);
  // [rows, C] and [rows], contiguous (views when the inputs already are).
  const Tensor x = raw::view(raw::contiguous(raw::permute(logits, layout.order)), {layout.rows, layout.classes});
  const Tensor t = raw::contiguous(raw::reshape(target, {layout.rows}));
  if (!x.is_cuda()) check_target_values(t, layout.classes, ignore_index);

  const TensorOptions acc = TensorOptions().dtype(loss_dtype(logits.dtype())).device(logits.device());
  Tensor loss = empty({layout.rows}, acc);
  Tensor lse = empty({layout.rows}, acc);  // logsumexp per row, for backward
  Tensor out, count;
  if (reduction != Reduction::none) {
    out = empty({}, acc);
    count = empty({}, TensorOptions().dtype(DType::i64).device(logits.device()));
  }
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::cross_entropy_forward_cuda(loss, lse, x, t, ignore_index);
    if (reduction != Reduction::none) ops::cross_entropy_reduce_cuda(out, count, loss, t, ignore_index, reduction);
#else
    ops::throw_no_cuda(kOp);
#endif
  } else {
    ops::cross_entropy_forward_cpu(loss, lse, x, t, ignore_index);
    if (reduction != Reduction::none) ops::cross_entropy_reduce_cpu(out, count, loss, t, ignore_index, reduction);
  }
  if (reduction == Reduction::none) out = raw::reshape(loss, target.shape());

  if (autograd::needs_grad({logits})) {
    auto node = std::make_shared<LambdaNode>("CrossEntropyBackward", [layout, ignore_index, reduction](
                                                                         const std::vector<Tensor>& g,
                                                                         const LambdaNode& self) {
      const Tensor x = self.saved_tensor("logits"), t = self.saved_tensor("target"), lse = self.saved_tensor("lse");
      const Tensor count = reduction == Reduction::mean ? self.saved_tensor("count") : Tensor();
      // [rows] for none, [] otherwise; in the loss dtype.
      const Tensor grad = raw::contiguous(
          raw::reshape(ops::as_dtype(g[0], lse.dtype()), reduction == Reduction::none ? Shape{layout.rows} : Shape{}));
      Tensor dx = empty(x.shape(), ops::options_of(x));
      if (x.is_cuda()) {
#if MT_WITH_CUDA
        ops::cross_entropy_backward_cuda(dx, grad, x, t, lse, count, ignore_index, reduction);
#else
            ops::throw_no_cuda(kOp);
#endif
      } else {
        ops::cross_entropy_backward_cpu(dx, grad, x, t, lse, count, ignore_index, reduction);
      }
      return std::vector<Tensor>{raw::contiguous(raw::permute(raw::view(dx, layout.permuted_shape), layout.inverse))};
    });
    node->save("logits", x);
    node->save("target", t);
    node->save("lse", lse);
    if (reduction == Reduction::mean) node->save("count", count);
    autograd::record(node, {logits}, {out});
  }
  return out;
}

// ---- linear_cross_entropy: the LM head fused with its loss ----

namespace {

constexpr const char* kFusedOp = "linear_cross_entropy";
// One chunk's logits: about 1 GiB. GPT-2's head (50304 classes, B*T = 16384) then runs in two
// chunks of 8192 rows. Chunks of 256 MiB (seven of 2341 rows) left the dx GEMM [2341, 768]
// fewer output tiles than the GPU has multiprocessors, and every further chunk re-reads and
// re-writes the f32 dW [V, C] it adds to.
constexpr int64_t kChunkLogitBytes = int64_t{1} << 30;

void validate_fused(const Tensor& x, const Tensor& weight, const Tensor& target, const LinearCrossEntropyOptions& o) {
  ops::check_floating(kFusedOp, x);
  ops::check_floating(kFusedOp, weight);
  ops::check_defined(kFusedOp, target, "target");
  ops::check_same_device(kFusedOp, x, weight);
  ops::check_same_device(kFusedOp, x, target);
  MT_CHECK_T(DTypeError, target.dtype() == DType::i64 || target.dtype() == DType::i32, kFusedOp,
             ": target must hold class indices of dtype i64 or i32, got ", ops::describe(target));
  MT_CHECK_T(ShapeError, x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), kFusedOp,
             ": expected x [N, C] and weight [V, C], got x ", ops::describe(x), " and weight ", ops::describe(weight));
  MT_CHECK_T(ShapeError, target.dim() == 1 && target.size(0) == x.size(0), kFusedOp, ": target ", ops::describe(target),
             " must be [N] for x ", ops::describe(x));
  MT_CHECK_T(ShapeError, weight.size(0) > 0, kFusedOp, ": weight ", ops::describe(weight), " has no classes");
  MT_CHECK(o.reduction != Reduction::none, kFusedOp,
           ": reduction none is not supported (the fused op keeps one gradient per input, for a scalar loss)");
  MT_CHECK(o.chunk_rows >= 0, kFusedOp, ": chunk_rows must be >= 0, got ", o.chunk_rows);
}

// Row i of x goes with row i of the unit-loss gradients; the chunk's logits
// buffer is reused in place for its gradient.
struct FusedHeadResult {
  Tensor loss_rows;  // [N] (acc dtype)
  Tensor dx_unit;    // [N, C] in x's dtype: d(sum of row losses)/dx, or undefined
  Tensor dw_unit;    // [V, C] in acc dtype: d(sum of row losses)/dW, or undefined
};

FusedHeadResult fused_head_forward(const Tensor& x, const Tensor& w, const Tensor& t, int64_t ignore_index,
                                   int64_t chunk_rows, bool want_dx, bool want_dw) {
  const int64_t rows = x.size(0), hidden = x.size(1), classes = w.size(0);
  const DType acc = loss_dtype(x.dtype());
  const TensorOptions acc_options = TensorOptions().dtype(acc).device(x.device());
  FusedHeadResult r;
  r.loss_rows = empty({rows}, acc_options);
  Tensor lse = empty({rows}, acc_options);
  if (want_dx) r.dx_unit = empty({rows, hidden}, ops::options_of(x));
  // The first chunk's GEMM writes dW (beta 0), the others add to it: no zero fill of [V, C].
  if (want_dw) r.dw_unit = rows > 0 ? empty({classes, hidden}, acc_options) : zeros({classes, hidden}, acc_options);
  // Chunks of equal size: a short last chunk would run its three GEMMs at a poor rate.
  if (rows > 0) {
    const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    chunk_rows = (rows + chunks - 1) / chunks;
  }
  const Tensor w3 = raw::unsqueeze(w, 0);
  Tensor logits_buffer = empty({std::min(rows, chunk_rows), classes}, ops::options_of(x));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const Tensor xc = raw::narrow(x, 0, r0, n), tc = raw::narrow(t, 0, r0, n);
    const Tensor lc = raw::narrow(r.loss_rows, 0, r0, n), sc = raw::narrow(lse, 0, r0, n);
    const Tensor logits = raw::narrow(logits_buffer, 0, 0, n);
    ops::GemmArgs args;
    args.transpose_b = ops::Transpose::yes;  // logits = x W^T
    ops::gemm(raw::unsqueeze(logits, 0), raw::unsqueeze(xc, 0), w3, args);
    const bool want_grad = want_dx || want_dw;
    if (x.is_cuda()) {
#if MT_WITH_CUDA
      if (want_grad) {  // logits <- softmax - onehot, in place
        ops::cross_entropy_unit_grad_inplace_cuda(lc, sc, logits, tc, ignore_index);
      } else {
        ops::cross_entropy_forward_cuda(lc, sc, logits, tc, ignore_index);
      }
#else
      ops::throw_no_cuda(kFusedOp);
#endif
    } else if (want_grad) {
      ops::cross_entropy_unit_grad_inplace_cpu(lc, sc, logits, tc, ignore_index);
    } else {
      ops::cross_entropy_forward_cpu(lc, sc, logits, tc, ignore_index);
    }
    if (want_dx) {  // dx_c [n, C] = dlogits [n, V] @ W [V, C]
      ops::gemm(raw::unsqueeze(raw::narrow(r.dx_unit, 0, r0, n), 0), raw::unsqueeze(logits, 0), w3);
    }
    if (want_dw) {  // dW [V, C] += dlogits^T [V, n] @ x_c [n, C], accumulated in f32/f64
      ops::GemmArgs acc_args;
      acc_args.transpose_a = ops::Transpose::yes;
      acc_args.beta = r0 == 0 ? 0.0 : 1.0;
      ops::gemm(raw::unsqueeze(r.dw_unit, 0), raw::unsqueeze(logits, 0), raw::unsqueeze(xc, 0), acc_args);
    }
  }
  return r;
}

// A unit-loss gradient scaled by the incoming gradient (/ count for mean), into a
// fresh tensor of `dtype` (the dtype of the input it is the gradient for).
Tensor scale_unit_grad(Tensor unit, DType dtype, const Tensor& grad, const Tensor& count, Reduction reduction) {
  const DType acc = loss_dtype(dtype);
  if (unit.dtype() != dtype && unit.dtype() != acc) unit = ops::as_dtype(unit, acc);
  const Tensor g = raw::contiguous(ops::as_dtype(grad, acc));
  Tensor out = empty(unit.shape(), TensorOptions().dtype(dtype).device(unit.device()));
  if (unit.is_cuda()) {
#if MT_WITH_CUDA
    ops::scale_by_loss_grad_cuda(out, unit, g, count, reduction);
#else
    ops::throw_no_cuda(kFusedOp);
#endif
  } else {
    ops::scale_by_loss_grad_cpu(out, unit, g, count, reduction);
  }
  return out;
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x_in, const Tensor& weight_in, const Tensor& target,
                            const LinearCrossEntropyOptions& options) {
  // x as any op's input; the weight's low-precision copy records nothing: the node records the
  // weight itself and writes its gradient in the weight's dtype, from the f32 sum of the chunks'
  // GEMMs, with no bf16 rounding and no Cast node to widen it again.
  const Tensor x_rec = autocast::cast_input(kFusedOp, x_in);  // the tensors the node's gradients are for
  const Tensor& w_rec = weight_in;
  const Tensor w_copy = autocast::operand_copies(kFusedOp, {weight_in})[0];
  validate_fused(x_rec, w_copy, target, options);
  const DType dtype = promote_types(x_rec.dtype(), w_copy.dtype());
  const Tensor x = raw::contiguous(ops::as_dtype(x_rec, dtype));
  const Tensor w = ops::as_dtype(w_copy, dtype);
  const Tensor t = raw::contiguous(target);
  const int64_t rows = x.size(0), classes = w.size(0);
  if (!x.is_cuda()) check_target_values(t, classes, options.ignore_index);

  const int64_t chunk_rows = std::max<int64_t>(
      1, options.chunk_rows > 0 ? options.chunk_rows
                                : kChunkLogitBytes / (classes * static_cast<int64_t>(element_size(dtype))));
  const bool want_dx = autograd::needs_grad({x_rec}), want_dw = autograd::needs_grad({w_rec});
  FusedHeadResult head = fused_head_forward(x, w, t, options.ignore_index,
                                            std::max<int64_t>(1, std::min(chunk_rows, rows)), want_dx, want_dw);

  const TensorOptions acc = TensorOptions().dtype(loss_dtype(dtype)).device(x.device());
  Tensor out = empty({}, acc);
  Tensor count = empty({}, TensorOptions().dtype(DType::i64).device(x.device()));
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::cross_entropy_reduce_cuda(out, count, head.loss_rows, t, options.ignore_index, options.reduction);
#else
    ops::throw_no_cuda(kFusedOp);
#endif
  } else {
    ops::cross_entropy_reduce_cpu(out, count, head.loss_rows, t, options.ignore_index, options.reduction);
  }

  if (want_dx || want_dw) {
    const Reduction reduction = options.reduction;
    const DType x_dtype = x_rec.dtype(), w_dtype = w_rec.dtype();
    auto node = std::make_shared<LambdaNode>(
        "LinearCrossEntropyBackward",
        [reduction, x_dtype, w_dtype](const std::vector<Tensor>& g, const LambdaNode& self) {
          const Tensor count = self.saved_tensor("count");
          Tensor gx, gw;
          if (self.needs_input_grad(0)) {
            gx = scale_unit_grad(self.saved_tensor("dx_unit"), x_dtype, g[0], count, reduction);
          }
          if (self.needs_input_grad(1)) {
            gw = scale_unit_grad(self.saved_tensor("dw_unit"), w_dtype, g[0], count, reduction);
          }
          return std::vector<Tensor>{gx, gw};
        });
    node->save("dx_unit", head.dx_unit);  // each defined only when its gradient is wanted
    node->save("dw_unit", head.dw_unit);
    node->save("count", count);
    autograd::record(node, {x_rec, w_rec}, {out});
  }
  return out;
}

}  // namespace mt
