// Cross-entropy: validation at the boundary, the fused forward (per-row loss and
// logsumexp, then the reduction), and the backward right after. Logits with
// extra dims [N, C, d1, ...] are permuted to rows [N * d1 * ..., C] (a copy),
// so the kernels only ever see contiguous rows.
#include "ops/loss/loss.h"
#include "autograd/autocast.h"

#include <vector>

#include "autograd/function.h"
#include "core/dispatch.h"
#include "ops/common.h"
#include "ops/loss/loss_kernels.h"
#include "ops/map.h"

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
  const Tensor logits = input.dtype() == DType::f16 || input.dtype() == DType::bf16
                            ? input
                            : autocast::cast_input("cross_entropy", input);
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
      const Tensor x = self.unpack(0), t = self.unpack(1), lse = self.unpack(2);
      const Tensor count = reduction == Reduction::mean ? self.unpack(3) : Tensor();
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
    node->saved.emplace_back(x);
    node->saved.emplace_back(t);
    node->saved.emplace_back(lse);
    if (reduction == Reduction::mean) node->saved.emplace_back(count);
    autograd::record(node, {logits}, {out});
  }
  return out;
}

}  // namespace mt
