// Layer norm and RMS norm: validation at the boundary, the fused forward (which
// keeps the per-row statistics), and the backward right after.
#include "ops/norm/norm.h"
#include "autograd/autocast.h"

#include <vector>

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/map.h"
#include "ops/norm/norm_kernels.h"

namespace mt {

using autograd::LambdaNode;
using autograd::SavedTensor;
using ops::NormKind;

namespace {

void check_param(const char* op, const char* what, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  const int64_t c = x.shape().back();
  MT_CHECK_T(DTypeError, p.dtype() == x.dtype(), op, ": ", what, " ", ops::describe(p), " must have the dtype of x ",
             ops::describe(x), " (cast one of them, or run the op under autocast)");
  ops::check_same_device(op, x, p);
  MT_CHECK_T(ShapeError, p.shape() == Shape{c}, op, ": ", what, " ", ops::describe(p), " must be [", c, "] for x ",
             ops::describe(x), " (normalised over its last dim)");
}

void validate(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = name_of(kind);
  ops::check_floating(op, x);
  MT_CHECK_T(ShapeError, x.dim() >= 1 && x.shape().back() > 0, op,
             ": x must be [..., C] with C > 0 (normalised over the last dim), got ", ops::describe(x));
  MT_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  check_param(op, "weight", weight, x);
  check_param(op, "bias", bias, x);
}

DType stat_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? raw::contiguous(t) : Tensor(); }

// Whether the CUDA kernels read or write `io` (y, dy) directly for an x of x_dtype:
// the same dtype, or a half type for f32.
bool cuda_io(DType x_dtype, DType io) { return io == x_dtype || (x_dtype == DType::f32 && is_half(io)); }

Tensor norm_op(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, DType out_dtype) {
  validate(kind, x, weight, bias, eps);
  const char* op = name_of(kind);
  MT_CHECK_T(DTypeError, is_floating(out_dtype), op, ": the output dtype must be floating, got ",
             dtype_name(out_dtype));
  const int64_t cols = x.shape().back();
  const int64_t rows = x.numel() / cols;
  const Tensor xr = raw::view(raw::contiguous(x), {rows, cols});  // [rows, C]
  const Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);

  const TensorOptions stats = TensorOptions().dtype(stat_dtype(x.dtype())).device(x.device());
  // CUDA writes y in out_dtype from registers; elsewhere y is computed in x's dtype and
  // then converted (the same values: one rounding from acc_t either way for f32 x).
  const bool direct = x.is_cuda() && cuda_io(x.dtype(), out_dtype);
  Tensor y = empty({rows, cols}, ops::options_of(x).dtype(direct ? out_dtype : x.dtype()));
  const Tensor mean = kind == NormKind::layer ? empty({rows}, stats) : Tensor();  // [rows]
  const Tensor rstd = empty({rows}, stats);                                       // [rows]
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::norm_forward_cuda(kind, y, mean, rstd, xr, w, b, eps);
#else
    ops::throw_no_cuda(op);
#endif
  } else {
    ops::norm_forward_cpu(kind, y, mean, rstd, xr, w, b, eps);
  }
  Tensor out = raw::view(ops::as_dtype(y, out_dtype), x.shape());

  const std::vector<Tensor> inputs =
      kind == NormKind::layer ? std::vector<Tensor>{x, weight, bias} : std::vector<Tensor>{x, weight};
  if (autograd::needs_grad(inputs)) {
    auto node = std::make_shared<LambdaNode>(
        kind == NormKind::layer ? "LayerNormBackward" : "RmsNormBackward",
        [kind, op, rows, cols](const std::vector<Tensor>& g, const LambdaNode& self) {
          auto saved = [&](size_t i) { return self.saved[i].defined() ? self.unpack(i) : Tensor(); };
          const Tensor xs = saved(0), rstd = saved(1), mean = saved(2), w = saved(3);
          const TensorOptions options = ops::options_of(g[0]).dtype(self.input_meta[0].dtype);
          // A half dy of an f32 x is read as it is on CUDA, converted in registers.
          const Tensor g0 =
              g[0].is_cuda() && cuda_io(options.dtype(), g[0].dtype()) ? g[0] : ops::as_dtype(g[0], options.dtype());
          const Tensor dy = raw::view(raw::contiguous(g0), {rows, cols});
          const Tensor dx = self.needs_input_grad(0) ? empty({rows, cols}, options) : Tensor();
          const Tensor dw = self.needs_input_grad(1) ? empty({cols}, options) : Tensor();
          const Tensor db = self.needs_input_grad(2) ? empty({cols}, options) : Tensor();
          if (dy.is_cuda()) {
#if MT_WITH_CUDA
            ops::norm_backward_cuda(kind, dx, dw, db, dy, xs, mean, rstd, w);
#else
            ops::throw_no_cuda(op);
#endif
          } else {
            ops::norm_backward_cpu(kind, dx, dw, db, dy, xs, mean, rstd, w);
          }
          std::vector<Tensor> grads{dx.defined() ? raw::view(dx, self.input_meta[0].shape) : Tensor(), dw};
          if (kind == NormKind::layer) grads.push_back(db);
          return grads;
        });
    // x and the statistics serve dx and dweight (dbias alone needs only dy);
    // the weight serves dx alone.
    const bool need_x = autograd::requires_grad(x) || autograd::requires_grad(weight);
    node->saved.emplace_back(need_x ? SavedTensor(xr) : SavedTensor());
    node->saved.emplace_back(need_x ? SavedTensor(rstd) : SavedTensor());
    node->saved.emplace_back(need_x ? SavedTensor(mean) : SavedTensor());
    node->saved.emplace_back(autograd::requires_grad(x) ? SavedTensor(w) : SavedTensor());
    autograd::record(node, inputs, {out});
  }
  return out;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const std::vector<Tensor> in = autocast::cast_inputs("layer_norm", {x, weight, bias});
  return norm_op(NormKind::layer, in[0], in[1], in[2], eps, in[0].dtype());
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, DType out_dtype) {
  const std::vector<Tensor> in = autocast::cast_inputs("layer_norm", {x, weight, bias});
  return norm_op(NormKind::layer, in[0], in[1], in[2], eps, out_dtype);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const std::vector<Tensor> in = autocast::cast_inputs("rms_norm", {x, weight});
  return norm_op(NormKind::rms, in[0], in[1], Tensor(), eps, in[0].dtype());
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, DType out_dtype) {
  const std::vector<Tensor> in = autocast::cast_inputs("rms_norm", {x, weight});
  return norm_op(NormKind::rms, in[0], in[1], Tensor(), eps, out_dtype);
}

}  // namespace mt
