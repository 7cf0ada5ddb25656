// conv2d, max_pool2d and avg_pool2d: validation at the boundary, the forward on
// the tensor's device, and each backward right after its forward. The kernels
// (conv_kernels.h) see contiguous tensors only and are never called with a
// zero-sized tensor; empty batches are handled here.
#include "ops/conv/conv.h"
#include "autograd/autocast.h"

#include <vector>

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/conv/conv_kernels.h"
#include "ops/elementwise/elementwise.h"
#include "ops/map.h"

namespace mt {

using autograd::LambdaNode;
using ops::Conv2dGeometry;
using ops::Pool2dGeometry;
using ops::PoolKind;

namespace {

// ---- conv2d ----

Conv2dGeometry conv_geometry(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o) {
  constexpr const char* op = "conv2d";
  ops::check_floating(op, x);
  ops::check_defined(op, w, "weight");
  ops::check_floating(op, w);
  MT_CHECK_T(ShapeError, x.dim() == 4, "conv2d: expected x of shape [N, C, H, W], got ", ops::describe(x));
  MT_CHECK_T(ShapeError, w.dim() == 4, "conv2d: expected a weight of shape [O, C / groups, kH, kW], got ",
             ops::describe(w));
  MT_CHECK_T(DTypeError, x.dtype() == w.dtype(), "conv2d: x and weight have different dtypes: ", ops::describe(x),
             " and ", ops::describe(w));
  ops::check_same_device(op, x, w);
  MT_CHECK(o.stride_h() >= 1 && o.stride_w() >= 1, "conv2d: the stride must be positive, got ", o.stride_h(), "x",
           o.stride_w());
  MT_CHECK(o.dilation_h() >= 1 && o.dilation_w() >= 1, "conv2d: the dilation must be positive, got ", o.dilation_h(),
           "x", o.dilation_w());
  MT_CHECK(o.padding_h() >= 0 && o.padding_w() >= 0, "conv2d: the padding must not be negative, got ", o.padding_h(),
           "x", o.padding_w());
  MT_CHECK(o.groups() >= 1, "conv2d: groups must be positive, got ", o.groups());

  Conv2dGeometry g;
  g.batch = x.size(0);
  g.in_channels = x.size(1);
  g.in_h = x.size(2);
  g.in_w = x.size(3);
  g.out_channels = w.size(0);
  g.kernel_h = w.size(2);
  g.kernel_w = w.size(3);
  g.stride_h = o.stride_h();
  g.stride_w = o.stride_w();
  g.padding_h = o.padding_h();
  g.padding_w = o.padding_w();
  g.dilation_h = o.dilation_h();
  g.dilation_w = o.dilation_w();
  g.groups = o.groups();

  MT_CHECK_T(
      ShapeError,
      g.in_channels >= 1 && g.in_h >= 1 && g.in_w >= 1 && g.out_channels >= 1 && g.kernel_h >= 1 && g.kernel_w >= 1,
      "conv2d: x ", ops::describe(x), " and weight ", ops::describe(w),
      " must have at least one channel, a non-empty image and a non-empty kernel");
  MT_CHECK_T(ShapeError, g.in_channels % g.groups == 0, "conv2d: groups = ", g.groups, " does not divide the ",
             g.in_channels, " input channels of x ", ops::describe(x));
  MT_CHECK_T(ShapeError, g.out_channels % g.groups == 0, "conv2d: groups = ", g.groups, " does not divide the ",
             g.out_channels, " output channels of weight ", ops::describe(w));
  MT_CHECK_T(ShapeError, w.size(1) * g.groups == g.in_channels, "conv2d: channel mismatch: x ", ops::describe(x),
             " has ", g.in_channels, " channels but weight ", ops::describe(w), " expects ", w.size(1) * g.groups, " (",
             w.size(1), " per group x ", g.groups, " groups)");
  const int64_t span_h = g.dilation_h * (g.kernel_h - 1) + 1, span_w = g.dilation_w * (g.kernel_w - 1) + 1;
  const int64_t padded_h = g.in_h + 2 * g.padding_h, padded_w = g.in_w + 2 * g.padding_w;
  MT_CHECK_T(ShapeError, span_h <= padded_h && span_w <= padded_w, "conv2d: kernel ", g.kernel_h, "x", g.kernel_w, " (",
             span_h, "x", span_w, " with dilation ", g.dilation_h, "x", g.dilation_w,
             ") is bigger than the padded input ", padded_h, "x", padded_w, " (x ", ops::describe(x), ", weight ",
             ops::describe(w), ", padding ", g.padding_h, "x", g.padding_w, ")");
  g.out_h = (padded_h - span_h) / g.stride_h + 1;
  g.out_w = (padded_w - span_w) / g.stride_w + 1;

  if (b.defined()) {
    ops::check_floating(op, b);
    MT_CHECK_T(ShapeError, b.dim() == 1 && b.size(0) == g.out_channels, "conv2d: expected a bias of shape [",
               g.out_channels, "] for weight ", ops::describe(w), ", got ", ops::describe(b));
    MT_CHECK_T(DTypeError, b.dtype() == x.dtype(), "conv2d: bias ", ops::describe(b), " and x ", ops::describe(x),
               " have different dtypes");
    ops::check_same_device(op, x, b);
  }
  return g;
}

Shape input_shape(const Conv2dGeometry& g) { return {g.batch, g.in_channels, g.in_h, g.in_w}; }
Shape weight_shape(const Conv2dGeometry& g) {
  return {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}
Shape output_shape(const Conv2dGeometry& g) { return {g.batch, g.out_channels, g.out_h, g.out_w}; }

// y = x (*) w, no bias, no recording.
Tensor conv_forward(const Tensor& x, const Tensor& w, const Conv2dGeometry& g) {
  Tensor y = empty(output_shape(g), ops::options_of(x));
  if (y.numel() == 0) return y;
  const Tensor xc = raw::contiguous(x), wc = raw::contiguous(w);
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::conv2d_forward_cuda(y, xc, wc, g);
#else
    ops::throw_no_cuda("conv2d");
#endif
  } else {
    ops::conv2d_forward_cpu(y, xc, wc, g);
  }
  return y;
}

// dx from dy and w: the transposed convolution.
Tensor conv_backward_input(const Tensor& grad, const Tensor& w, const Conv2dGeometry& g) {
  Tensor dx = empty(input_shape(g), ops::options_of(w));
  const Tensor dy = raw::contiguous(ops::as_dtype(grad, w.dtype()));
  if (dy.numel() == 0) return dx.zero_();
  const Tensor wc = raw::contiguous(w);
  if (w.is_cuda()) {
#if MT_WITH_CUDA
    ops::conv2d_backward_input_cuda(dx, dy, wc, g);
#else
    ops::throw_no_cuda("conv2d");
#endif
  } else {
    ops::conv2d_backward_input_cpu(dx, dy, wc, g);
  }
  return dx;
}

// dw from dy and x, summed over the batch.
Tensor conv_backward_weight(const Tensor& grad, const Tensor& x, const Conv2dGeometry& g) {
  Tensor dw = empty(weight_shape(g), ops::options_of(x));
  const Tensor dy = raw::contiguous(ops::as_dtype(grad, x.dtype()));
  if (dy.numel() == 0) return dw.zero_();  // an empty batch contributes nothing
  const Tensor xc = raw::contiguous(x);
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::conv2d_backward_weight_cuda(dw, dy, xc, g);
#else
    ops::throw_no_cuda("conv2d");
#endif
  } else {
    ops::conv2d_backward_weight_cpu(dw, dy, xc, g);
  }
  return dw;
}

// ---- pooling ----

Pool2dGeometry pool_geometry(const char* op, const Tensor& x, const Pool2dOptions& o) {
  ops::check_floating(op, x);
  MT_CHECK_T(ShapeError, x.dim() == 4, op, ": expected x of shape [N, C, H, W], got ", ops::describe(x));
  MT_CHECK(o.kernel_h() >= 1 && o.kernel_w() >= 1, op, ": the kernel must be positive, got ", o.kernel_h(), "x",
           o.kernel_w());
  MT_CHECK(o.stride_h() >= 1 && o.stride_w() >= 1, op, ": the stride must be positive, got ", o.stride_h(), "x",
           o.stride_w());
  MT_CHECK(o.padding_h() >= 0 && o.padding_w() >= 0, op, ": the padding must not be negative, got ", o.padding_h(), "x",
           o.padding_w());
  MT_CHECK(2 * o.padding_h() <= o.kernel_h() && 2 * o.padding_w() <= o.kernel_w(), op, ": padding ", o.padding_h(), "x",
           o.padding_w(), " must be at most half the kernel ", o.kernel_h(), "x", o.kernel_w());
  MT_CHECK_T(ShapeError, x.size(2) >= 1 && x.size(3) >= 1, op, ": x ", ops::describe(x), " has an empty image");
  Pool2dGeometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  g.in_h = x.size(2);
  g.in_w = x.size(3);
  g.kernel_h = o.kernel_h();
  g.kernel_w = o.kernel_w();
  g.stride_h = o.stride_h();
  g.stride_w = o.stride_w();
  g.padding_h = o.padding_h();
  g.padding_w = o.padding_w();
  const int64_t padded_h = g.in_h + 2 * g.padding_h, padded_w = g.in_w + 2 * g.padding_w;
  MT_CHECK_T(ShapeError, g.kernel_h <= padded_h && g.kernel_w <= padded_w, op, ": kernel ", g.kernel_h, "x", g.kernel_w,
             " is bigger than the padded input ", padded_h, "x", padded_w, " (x ", ops::describe(x), ", padding ",
             g.padding_h, "x", g.padding_w, ")");
  g.out_h = (padded_h - g.kernel_h) / g.stride_h + 1;
  g.out_w = (padded_w - g.kernel_w) / g.stride_w + 1;
  return g;
}

Shape pool_output_shape(const Pool2dGeometry& g) { return {g.batch, g.channels, g.out_h, g.out_w}; }

// The gradient of a pooling op's input: zeros of the input's shape, dtype and device.
Tensor pool_grad_like(const LambdaNode& self) {
  const autograd::TensorMeta& in = self.input_meta[0];
  return empty(in.shape, TensorOptions().dtype(in.dtype).device(in.device));
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& options) {
  const std::vector<Tensor> in = autocast::cast_inputs("conv2d", {x_in, weight_in, bias_in});
  const Tensor& x = in[0];
  const Tensor& weight = in[1];
  const Tensor& bias = in[2];
  const Conv2dGeometry g = conv_geometry(x, weight, bias, options);
  Tensor out = conv_forward(x, weight, g);
  if (autograd::needs_grad({x, weight})) {
    auto node =
        std::make_shared<LambdaNode>("Conv2dBackward", [g](const std::vector<Tensor>& grads, const LambdaNode& self) {
          return std::vector<Tensor>{
              self.needs_input_grad(0) ? conv_backward_input(grads[0], self.saved_tensor("weight"), g) : Tensor(),
              self.needs_input_grad(1) ? conv_backward_weight(grads[0], self.saved_tensor("x"), g) : Tensor()};
        });
    // dx needs the weight and dw needs x: each is saved only when the other's gradient is wanted.
    if (autograd::requires_grad(weight)) node->save("x", x);
    if (autograd::requires_grad(x)) node->save("weight", weight);
    autograd::record(node, {x, weight}, {out});
  }
  // The bias goes through the element-wise add, broadcast over N, OH and OW; its
  // backward sums dy into db (only when the bias needs a gradient), so
  // Conv2dBackward handles x and weight alone.
  if (bias.defined()) out = add(out, bias.reshape({1, g.out_channels, 1, 1}));
  return out;
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const Pool2dGeometry g = pool_geometry("max_pool2d", x, options);
  const Tensor xc = raw::contiguous(x);
  Tensor y = empty(pool_output_shape(g), ops::options_of(x));
  // The CPU keeps each window's argmax; cuDNN's backward finds it again from x and y.
  Tensor indices;
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    if (y.numel() > 0) ops::pool2d_forward_cuda(y, xc, PoolKind::max, g);
#else
    ops::throw_no_cuda("max_pool2d");
#endif
  } else {
    indices = empty(pool_output_shape(g), TensorOptions().dtype(DType::i64));
    if (y.numel() > 0) ops::max_pool2d_forward_cpu(y, indices, xc, g);
  }
  if (autograd::needs_grad({x})) {
    auto node = std::make_shared<LambdaNode>(
        "MaxPool2dBackward", [g](const std::vector<Tensor>& grads, const LambdaNode& self) {
          Tensor dx = pool_grad_like(self);
          const Tensor dy = raw::contiguous(ops::as_dtype(grads[0], dx.dtype()));
          if (dy.numel() == 0) return std::vector<Tensor>{dx.zero_()};
          if (dx.is_cuda()) {
#if MT_WITH_CUDA
            ops::pool2d_backward_cuda(dx, dy, raw::contiguous(self.saved_tensor("y")),
                                      raw::contiguous(self.saved_tensor("x")), PoolKind::max, g);
#else
            ops::throw_no_cuda("max_pool2d");
#endif
          } else {
            ops::max_pool2d_backward_cpu(dx, dy, self.saved_tensor("indices"), g);
          }
          return std::vector<Tensor>{dx};
        });
    if (x.is_cuda()) {
      node->save("x", x);
      node->save("y", y.detach());
    } else {
      node->save("indices", indices);
    }
    autograd::record(node, {x}, {y});
  }
  return y;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const Pool2dGeometry g = pool_geometry("avg_pool2d", x, options);
  const Tensor xc = raw::contiguous(x);
  Tensor y = empty(pool_output_shape(g), ops::options_of(x));
  if (y.numel() > 0) {
    if (x.is_cuda()) {
#if MT_WITH_CUDA
      ops::pool2d_forward_cuda(y, xc, PoolKind::average, g);
#else
      ops::throw_no_cuda("avg_pool2d");
#endif
    } else {
      ops::avg_pool2d_forward_cpu(y, xc, g);
    }
  }
  if (autograd::needs_grad({x})) {
    // The gradient depends on the geometry alone: nothing is saved.
    auto node = std::make_shared<LambdaNode>(
        "AvgPool2dBackward", [g](const std::vector<Tensor>& grads, const LambdaNode& self) {
          Tensor dx = pool_grad_like(self);
          const Tensor dy = raw::contiguous(ops::as_dtype(grads[0], dx.dtype()));
          if (dy.numel() == 0) return std::vector<Tensor>{dx.zero_()};
          if (dx.is_cuda()) {
#if MT_WITH_CUDA
            ops::pool2d_backward_cuda(dx, dy, Tensor(), Tensor(), PoolKind::average, g);
#else
            ops::throw_no_cuda("avg_pool2d");
#endif
          } else {
            ops::avg_pool2d_backward_cpu(dx, dy, g);
          }
          return std::vector<Tensor>{dx};
        });
    autograd::record(node, {x}, {y});
  }
  return y;
}

}  // namespace mt
