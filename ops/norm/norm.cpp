// Layer norm and RMS norm: validation at the boundary, the fused forward (which
// keeps the per-row statistics), and the backward right after.
#include "ops/norm/norm.h"
#include "autograd/autocast.h"

#include <vector>

#include "autograd/function.h"
#include "core/cuda_context.h"
#include "ops/common.h"
#include "ops/elementwise/functors.h"
#include "ops/map.h"
#include "ops/norm/norm_kernels.h"

namespace mt {

using autograd::LambdaNode;
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

void validate(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
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

// The op's name in messages: the residual variants are add_layer_norm / add_rms_norm.
const char* op_name(NormKind kind, bool residual) {
  if (!residual) return name_of(kind);
  return kind == NormKind::layer ? "add_layer_norm" : "add_rms_norm";
}

void validate_delta(const char* op, const Tensor& x, const Tensor& delta) {
  ops::check_floating(op, delta);
  ops::check_same_device(op, x, delta);
  MT_CHECK_T(ShapeError, delta.shape() == x.shape(), op, ": delta ", ops::describe(delta), " must have the shape of x ",
             ops::describe(x), " (the residual add does not broadcast)");
  MT_CHECK_T(DTypeError, delta.dtype() == x.dtype() || (x.dtype() == DType::f32 && is_half(delta.dtype())), op,
             ": delta ", ops::describe(delta), " must have the dtype of x ", ops::describe(x),
             " or, beside an f32 x (the residual stream under autocast), f16 or bf16; the sum has x's dtype");
}

struct NormOutputs {
  Tensor sum;  // x + delta (residual variants only)
  Tensor y;
};

// What the backward's kernels need beside dy: the node's saved tensors, unpacked.
struct NormSaved {
  Tensor x, rstd, mean, weight;  // x: the norm's input (the sum, for the residual variants)
};

// dx [rows, C] (or undefined when not wanted), dweight and dbias (undefined when not wanted),
// from dy [rows, C]; with a residual, dx also holds dsum and ddelta is written when its dtype
// is dy's half type (else left for the caller).
void run_norm_backward(NormKind kind, const char* op, const Tensor& dx, const Tensor& dw, const Tensor& db,
                       const Tensor& dy, const NormSaved& saved, const ops::NormResidualGrad& residual) {
  if (dy.is_cuda()) {
#if MT_WITH_CUDA
    ops::norm_backward_cuda(kind, dx, dw, db, dy, saved.x, saved.mean, saved.rstd, saved.weight, residual);
#else
    ops::throw_no_cuda(op);
#endif
    return;
  }
  ops::norm_backward_cpu(kind, dx, dw, db, dy, saved.x, saved.mean, saved.rstd, saved.weight);
  if (dx.defined() && residual.dsum.defined()) ops::run_binary(dx, dx, residual.dsum, op, fn::Add{});
}

// Layer / RMS norm of x, or of x + delta when delta is defined (then also returned as sum).
NormOutputs norm_op(NormKind kind, const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias,
                    double eps, DType out_dtype) {
  const bool residual = delta.defined();
  const char* op = op_name(kind, residual);
  validate(op, x, weight, bias, eps);
  // The CUDA kernels are programmatic dependents of the kernel before them: their outputs'
  // allocations must not come between (in a captured graph).
  const cuda::DependentLaunchScope dependent_launch;
  if (residual) validate_delta(op, x, delta);
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
  // The residual: CUDA reads a delta of x's dtype or y's half type as it is; anything else is
  // first converted to x's dtype. The CPU adds first and normalises the sum.
  ops::NormResidual add;
  if (residual) {
    add.sum = empty({rows, cols}, ops::options_of(x));
    const bool read_as_is = delta.dtype() == x.dtype() || (direct && delta.dtype() == y.dtype());
    add.delta =
        raw::view(raw::contiguous(read_as_is && x.is_cuda() ? delta : ops::as_dtype(delta, x.dtype())), {rows, cols});
  }
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::norm_forward_cuda(kind, y, mean, rstd, xr, w, b, eps, add);
#else
    ops::throw_no_cuda(op);
#endif
  } else {
    if (residual) ops::run_binary(add.sum, xr, add.delta, op, fn::Add{});
    ops::norm_forward_cpu(kind, y, mean, rstd, residual ? add.sum : xr, w, b, eps);
  }
  NormOutputs outputs;
  outputs.y = raw::view(ops::as_dtype(y, out_dtype), x.shape());
  if (residual) outputs.sum = raw::view(add.sum, x.shape());

  // The node's inputs: (x, [delta,] weight, [bias]); the parameters' gradients follow dx's.
  std::vector<Tensor> inputs{x};
  if (residual) inputs.push_back(delta);
  inputs.push_back(weight);
  if (kind == NormKind::layer) inputs.push_back(bias);
  if (!autograd::needs_grad(inputs)) return outputs;
  const size_t params = residual ? 2 : 1;  // the index of weight among the inputs
  auto node = std::make_shared<LambdaNode>(
      residual ? (kind == NormKind::layer ? "AddLayerNormBackward" : "AddRmsNormBackward")
               : (kind == NormKind::layer ? "LayerNormBackward" : "RmsNormBackward"),
      [kind, op, rows, cols, residual, params](const std::vector<Tensor>& g, const LambdaNode& self) {
        const cuda::DependentLaunchScope dependent_launch;  // as in the forward
        const NormSaved kept{self.saved_tensor_or_none("x"), self.saved_tensor_or_none("rstd"),
                             self.saved_tensor_or_none("mean"), self.saved_tensor_or_none("weight")};
        const DType x_dtype = self.input_meta[0].dtype;
        const TensorOptions options = ops::options_of(g[0]).dtype(x_dtype);
        const Tensor& gy = g.back();  // y's gradient (the outputs are [sum,] y)
        // A half dy of an f32 x is read as it is on CUDA, converted in registers.
        const Tensor g0 = gy.is_cuda() && cuda_io(x_dtype, gy.dtype()) ? gy : ops::as_dtype(gy, x_dtype);
        const Tensor dy = raw::view(raw::contiguous(g0), {rows, cols});
        const bool want_x = self.needs_input_grad(0) || (residual && self.needs_input_grad(1));
        const Tensor dx = want_x ? empty({rows, cols}, options) : Tensor();
        const Tensor dw = self.needs_input_grad(params) ? empty({cols}, options) : Tensor();
        const Tensor db =
            kind == NormKind::layer && self.needs_input_grad(params + 1) ? empty({cols}, options) : Tensor();
        ops::NormResidualGrad add;
        Tensor ddelta;
        if (residual && want_x) {
          add.dsum = raw::view(raw::contiguous(ops::as_dtype(g[0], x_dtype)), {rows, cols});
          const DType delta_dtype = self.input_meta[1].dtype;
          if (self.needs_input_grad(1) && delta_dtype != x_dtype && dy.is_cuda() && delta_dtype == dy.dtype()) {
            add.ddelta = ddelta = empty({rows, cols}, options.dtype(delta_dtype));
          }
        }
        run_norm_backward(kind, op, dx, dw, db, dy, kept, add);
        std::vector<Tensor> grads{self.needs_input_grad(0) && dx.defined() ? raw::view(dx, self.input_meta[0].shape)
                                                                           : Tensor()};
        if (residual) {
          // delta's gradient is x's, in delta's dtype: written by the kernel, or converted here.
          if (self.needs_input_grad(1) && !ddelta.defined()) ddelta = ops::as_dtype(dx, self.input_meta[1].dtype);
          grads.push_back(self.needs_input_grad(1) ? raw::view(ddelta, self.input_meta[1].shape) : Tensor());
        }
        grads.push_back(dw);
        if (kind == NormKind::layer) grads.push_back(db);
        return grads;
      });
  // The norm's input and the statistics serve dx and dweight (dbias alone needs only dy);
  // the weight serves dx alone.
  const bool want_x = autograd::requires_grad(x) || (residual && autograd::requires_grad(delta));
  const bool need_input = want_x || autograd::requires_grad(weight);
  if (need_input) {
    node->save("x", residual ? add.sum : xr);
    node->save("rstd", rstd);
    node->save("mean", mean);  // undefined (nothing saved) for RMS norm
  }
  if (want_x) node->save("weight", w);
  if (kind == NormKind::rms && want_x) {
    // The output is one pass over the saved input (the sum, for add_rms_norm) and weight: the
    // projections that save it as their input may keep this recipe instead (RebuildSavedGuard).
    // The same kernel on the same f32 values, so the same output bit for bit.
    node->set_rebuild(residual ? 1 : 0, [eps, out_dtype, shape = x.shape()](const LambdaNode& self) {
      const Tensor y_again = norm_op(NormKind::rms, self.saved_tensor("x"), Tensor(),
                                     self.saved_tensor_or_none("weight"), Tensor(), eps, out_dtype)
                                 .y;
      return raw::view(y_again, shape);
    });
  }
  std::vector<Tensor> recorded_outputs;
  if (residual) recorded_outputs.push_back(outputs.sum);
  recorded_outputs.push_back(outputs.y);
  autograd::record(node, inputs, recorded_outputs);
  return outputs;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const std::vector<Tensor> in = autocast::cast_inputs("layer_norm", {x, weight, bias});
  return norm_op(NormKind::layer, in[0], Tensor(), in[1], in[2], eps, in[0].dtype()).y;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, DType out_dtype) {
  const std::vector<Tensor> in = autocast::cast_inputs("layer_norm", {x, weight, bias});
  return norm_op(NormKind::layer, in[0], Tensor(), in[1], in[2], eps, out_dtype).y;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const std::vector<Tensor> in = autocast::cast_inputs("rms_norm", {x, weight});
  return norm_op(NormKind::rms, in[0], Tensor(), in[1], Tensor(), eps, in[0].dtype()).y;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, DType out_dtype) {
  const std::vector<Tensor> in = autocast::cast_inputs("rms_norm", {x, weight});
  return norm_op(NormKind::rms, in[0], Tensor(), in[1], Tensor(), eps, out_dtype).y;
}

// Under autocast x and the parameters go to f32 as layer_norm's do; delta is read as it is
// (a half delta beside an f32 x is widened in registers).
AddNorm add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps,
                       DType out_dtype) {
  const std::vector<Tensor> in = autocast::cast_inputs("add_layer_norm", {x, weight, bias});
  const NormOutputs out = norm_op(NormKind::layer, in[0], delta, in[1], in[2], eps, out_dtype);
  return {out.sum, out.y};
}

AddNorm add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps) {
  const std::vector<Tensor> in = autocast::cast_inputs("add_layer_norm", {x, weight, bias});
  const NormOutputs out = norm_op(NormKind::layer, in[0], delta, in[1], in[2], eps, in[0].dtype());
  return {out.sum, out.y};
}

AddNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps, DType out_dtype) {
  const std::vector<Tensor> in = autocast::cast_inputs("add_rms_norm", {x, weight});
  const NormOutputs out = norm_op(NormKind::rms, in[0], delta, in[1], Tensor(), eps, out_dtype);
  return {out.sum, out.y};
}

AddNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps) {
  const std::vector<Tensor> in = autocast::cast_inputs("add_rms_norm", {x, weight});
  const NormOutputs out = norm_op(NormKind::rms, in[0], delta, in[1], Tensor(), eps, in[0].dtype());
  return {out.sum, out.y};
}

}  // namespace mt
