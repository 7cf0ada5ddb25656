// where / masked_fill: validation, the select forward, and backward through the
// same select with a zero in place of the unselected side.
#include "ops/where/where.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "ops/common.h"
#include "ops/map.h"
#include "ops/reduction/reduction.h"
#include "ops/where/where_kernels.h"

namespace mt {

using autograd::LambdaNode;

namespace {

void check_mask(const char* op, const Tensor& m, const char* what) {
  ops::check_defined(op, m, what);
  MT_CHECK_T(DTypeError, m.dtype() == DType::boolean || m.dtype() == DType::u8, op, ": ", what,
             " must be bool or u8, got ", ops::describe(m));
}

// cond ? a : b, each broadcast to `shape`, a and b converted to `dtype` (no recording).
Tensor select(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& shape, DType dtype) {
  Tensor out = empty(shape, TensorOptions().dtype(dtype).device(a.device()));
  const Tensor c = raw::expand(cond, shape);
  const Tensor x = raw::expand(ops::as_dtype(a, dtype), shape);
  const Tensor y = raw::expand(ops::as_dtype(b, dtype), shape);
  if (out.is_cuda()) {
#if MT_WITH_CUDA
    ops::where_cuda(out, c, x, y);
#else
    ops::throw_no_cuda("where");
#endif
  } else {
    ops::where_cpu(out, c, x, y);
  }
  return out;
}

// A zero-dimensional zero like g (broadcast by select, never materialised at full size).
Tensor scalar_zero(const Tensor& g) { return zeros({}, ops::options_of(g)); }

}  // namespace

Tensor where(const Tensor& condition, const Tensor& a_in, const Tensor& b_in) {
  const std::vector<Tensor> in = autocast::cast_inputs("where", {a_in, b_in});
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  check_mask("where", condition, "condition");
  ops::check_floating("where", a);
  ops::check_floating("where", b);
  ops::check_same_device("where", condition, a);
  ops::check_same_device("where", a, b);
  const Shape shape =
      raw::broadcast_shapes(raw::broadcast_shapes(condition.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = select(condition, a, b, shape, promote_types(a.dtype(), b.dtype()));
  if (autograd::needs_grad({a, b})) {
    auto node = std::make_shared<LambdaNode>("WhereBackward", [](const std::vector<Tensor>& g, const LambdaNode& self) {
      const Tensor cond = self.saved_tensor("condition");
      const Tensor zero = scalar_zero(g[0]);
      Tensor ga, gb;
      if (self.needs_input_grad(0))
        ga = sum_to(select(cond, g[0], zero, g[0].shape(), g[0].dtype()), self.input_meta[0].shape);
      if (self.needs_input_grad(1))
        gb = sum_to(select(cond, zero, g[0], g[0].shape(), g[0].dtype()), self.input_meta[1].shape);
      return std::vector<Tensor>{ga, gb};
    });
    node->save("condition", condition);
    autograd::record(node, {a, b}, {out});
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  ops::check_floating("masked_fill", x);
  check_mask("masked_fill", mask, "mask");
  ops::check_same_device("masked_fill", x, mask);
  const Shape shape = raw::broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  MT_CHECK_T(ShapeError, shape == x.shape(), "masked_fill: mask ", ops::describe(mask),
             " must broadcast to the input's shape, but input ", ops::describe(x), " and mask broadcast to ",
             shape_str(shape));
  Tensor out = select(mask, full({}, value, ops::options_of(x)), x, x.shape(), x.dtype());
  if (autograd::needs_grad({x})) {
    auto node =
        std::make_shared<LambdaNode>("MaskedFillBackward", [](const std::vector<Tensor>& g, const LambdaNode& self) {
          return std::vector<Tensor>{
              select(self.saved_tensor("mask"), scalar_zero(g[0]), g[0], g[0].shape(), g[0].dtype())};
        });
    node->save("mask", mask);
    node->infinite_outputs_by_design = std::isinf(value);  // a mask's -inf is not an overflow
    autograd::record(node, {x}, {out});
  }
  return out;
}

}  // namespace mt
