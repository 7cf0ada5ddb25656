// RoPE: validation, the output's layout, forward and the inverse-rotation backward.
#include "ops/rope/rope.h"

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/map.h"
#include "ops/rope/rope_kernels.h"

namespace mt {

namespace {

constexpr const char* kOp = "rope";

// An empty [B, H, T, D] tensor in x's layout: contiguous when x is, [B, T, H, D] storage when x
// is the heads view of a projection (or any other layout), which attention then reads in place.
Tensor empty_like_heads(const Tensor& x) {
  const auto options = ops::options_of(x);
  if (x.is_contiguous()) return empty(x.shape(), options);
  return empty({x.size(0), x.size(2), x.size(1), x.size(3)}, options).transpose(1, 2);
}

Tensor rotate(const Tensor& x, const Tensor& inv_freq, const ops::RopeRotation& rotation) {
  Tensor out = empty_like_heads(x);
  if (x.numel() == 0) return out;
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::rope_cuda(out, x, inv_freq, rotation);
#else
    ops::throw_no_cuda(kOp);
#endif
  } else {
    ops::rope_cpu(out, x, inv_freq, rotation);
  }
  return out;
}

void check_rope_inputs(const Tensor& x, const Tensor& inv_freq) {
  ops::check_floating(kOp, x);
  ops::check_same_device(kOp, x, inv_freq);
  MT_CHECK_T(ShapeError, x.dim() == 4 && x.size(3) % 2 == 0 && x.stride(3) == 1, kOp,
             ": x must be [B, H, T, D] with an even D and a contiguous last dimension, got ", ops::describe(x),
             " with strides ", shape_str(x.strides()));
  MT_CHECK_T(ShapeError, inv_freq.dim() == 1 && inv_freq.size(0) == x.size(3) / 2 && inv_freq.is_contiguous(), kOp,
             ": inv_freq must be a contiguous [D/2] = [", x.size(3) / 2, "], got ", ops::describe(inv_freq));
  MT_CHECK_T(DTypeError, inv_freq.dtype() == DType::f32, kOp, ": inv_freq must be f32, got ", ops::describe(inv_freq));
}

// The forward rotation, and a backward that rotates the gradient back by the same angles. The
// node holds `positions` (when given), so the data it points to lives as long as the graph.
Tensor rotate_with_backward(const Tensor& x, const Tensor& inv_freq, int64_t start, const Tensor& positions) {
  const auto rotation = [positions, start](int sign) {
    return ops::RopeRotation{start, sign,
                             positions.defined() ? static_cast<const int64_t*>(positions.data_ptr()) : nullptr};
  };
  Tensor out = rotate(x, inv_freq, rotation(+1));
  if (autograd::needs_grad({x})) {
    auto node = std::make_shared<autograd::LambdaNode>(
        "RopeBackward", [inv_freq, positions, rotation](const std::vector<Tensor>& g, const autograd::LambdaNode&) {
          Tensor grad = g[0];
          if (grad.stride(3) != 1) grad = grad.contiguous();
          return std::vector<Tensor>{rotate(grad, inv_freq, rotation(-1))};
        });
    autograd::record(node, {x}, {out});
  }
  return out;
}

}  // namespace

Tensor rope(const Tensor& x, const Tensor& inv_freq, int64_t start) {
  check_rope_inputs(x, inv_freq);
  MT_CHECK(start >= 0, kOp, ": start must be >= 0, got ", start);
  return rotate_with_backward(x, inv_freq, start, Tensor());
}

Tensor rope(const Tensor& x, const Tensor& inv_freq, const Tensor& positions) {
  check_rope_inputs(x, inv_freq);
  ops::check_same_device(kOp, x, positions);
  MT_CHECK_T(DTypeError, positions.dtype() == DType::i64, kOp, ": positions must be i64, got ",
             ops::describe(positions));
  MT_CHECK_T(ShapeError,
             positions.dim() == 2 && positions.size(0) == x.size(0) && positions.size(1) == x.size(2) &&
                 positions.is_contiguous(),
             kOp, ": positions must be a contiguous [B, T] = [", x.size(0), ", ", x.size(2), "] for x ",
             ops::describe(x), ", got ", ops::describe(positions));
  return rotate_with_backward(x, inv_freq, 0, positions);
}

}  // namespace mt
