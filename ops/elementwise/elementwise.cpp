// Element-wise ops: validation, forward on the tensor's device, and the backward
// of each op written right after its forward. Binary ops promote mixed dtypes
// themselves, which is what autocast's "widest type" policy asks of them.
#include "ops/elementwise/elementwise.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "ops/common.h"
#include "ops/elementwise/functors.h"
#include "ops/map.h"
#include "ops/reduction/reduction.h"

namespace mt {

using autograd::LambdaNode;

namespace {

// ---- shared forward helpers (no recording) ----

template <typename Op>
Tensor map_unary(const char* name, const Tensor& x, Op op) {
  ops::check_floating(name, x);
  Tensor out = empty(x.shape(), ops::options_of(x));
  ops::run_unary(out, x, name, op);
  return out;
}

template <typename Op>
Tensor map_binary(const char* name, const Tensor& a, const Tensor& b, Op op) {
  ops::check_floating(name, a);
  ops::check_floating(name, b);
  ops::check_same_device(name, a, b);
  const DType dtype = promote_types(a.dtype(), b.dtype());
  const Shape shape = raw::broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, TensorOptions().dtype(dtype).device(a.device()));
#if MT_WITH_CUDA
  // f32 with f16/bf16 (autocast's residual adds): the half input is widened in registers.
  if (out.is_cuda() && a.dtype() != b.dtype() && ops::binary_f32_from_mixed_cuda(out, a, b, op)) return out;
#endif
  ops::run_binary(out, raw::expand(ops::as_dtype(a, dtype), shape), raw::expand(ops::as_dtype(b, dtype), shape), name,
                  op);
  return out;
}

// (grad, saved) -> gradient, element-wise; both already have the output's shape.
template <typename Op>
Tensor map_grad(const char* name, const Tensor& grad, const Tensor& saved, Op op) {
  Tensor out = empty(grad.shape(), ops::options_of(grad));
  ops::run_binary(out, grad, raw::expand(ops::as_dtype(saved, grad.dtype()), grad.shape()), name, op);
  return out;
}

// Records a one-input op whose derivative is `Grad(grad, saved)`, where saved is
// the op's input (SaveInput) or its output (SaveOutput).
enum class Saved { input, output };

template <typename Fwd, typename Grad>
Tensor unary_op(const char* name, const Tensor& input, Fwd fwd, Grad grad_fn, Saved which) {
  const Tensor x = autocast::cast_input(name, input);  // exp, log, pow, rsqrt run in f32 under autocast
  Tensor out = map_unary(name, x, fwd);
  if (autograd::needs_grad({x})) {
    const char* saved = which == Saved::input ? "x" : "y";
    auto node = std::make_shared<LambdaNode>(
        std::string(name) + "Backward", [name, grad_fn, saved](const std::vector<Tensor>& g, const LambdaNode& self) {
          return std::vector<Tensor>{map_grad(name, g[0], self.saved_tensor(saved), grad_fn)};
        });
    node->save(saved, which == Saved::input ? x : out.detach());
    autograd::record(node, {x}, {out});
  }
  return out;
}

// Gradients of a broadcast binary op: each input's gradient summed back to its shape.
std::vector<Tensor> reduce_to_inputs(const LambdaNode& self, Tensor ga, Tensor gb) {
  return {self.needs_input_grad(0) ? sum_to(ga, self.input_meta[0].shape) : Tensor(),
          self.needs_input_grad(1) ? sum_to(gb, self.input_meta[1].shape) : Tensor()};
}

}  // namespace

// ---- binary arithmetic ----

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("add", a, b, fn::Add{});
  if (autograd::needs_grad({a, b})) {
    auto node = std::make_shared<LambdaNode>("AddBackward", [](const std::vector<Tensor>& g, const LambdaNode& self) {
      return reduce_to_inputs(self, g[0], g[0]);
    });
    autograd::record(node, {a, b}, {out});
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("sub", a, b, fn::Sub{});
  if (autograd::needs_grad({a, b})) {
    auto node = std::make_shared<LambdaNode>("SubBackward", [](const std::vector<Tensor>& g, const LambdaNode& self) {
      return reduce_to_inputs(self, g[0], self.needs_input_grad(1) ? neg(g[0]) : Tensor());
    });
    autograd::record(node, {a, b}, {out});
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  // A tensor times itself (a loss's diff * diff): one node with one edge, whose backward is one
  // kernel, where the product's two gradients would take two kernels and the engine's sum a third.
  // The values are the same bit for bit, except where g x is subnormal in the tensor's dtype:
  // 2 g x rounded once can then differ by the last subnormal step from g x rounded, doubled.
  if (a.impl() == b.impl() && is_floating(a.dtype()) && autograd::needs_grad({a})) {
    return unary_op("mul", a, fn::Square{}, fn::SquareGrad{}, Saved::input);
  }
  Tensor out = map_binary("mul", a, b, fn::Mul{});
  if (autograd::needs_grad({a, b})) {
    auto node = std::make_shared<LambdaNode>("MulBackward", [](const std::vector<Tensor>& g, const LambdaNode& self) {
      // d(ab)/da = b, d(ab)/db = a: each input is saved only if the other needs a gradient.
      return reduce_to_inputs(self, self.needs_input_grad(0) ? mul(g[0], self.saved_tensor("b")) : Tensor(),
                              self.needs_input_grad(1) ? mul(g[0], self.saved_tensor("a")) : Tensor());
    });
    if (autograd::requires_grad(b)) node->save("a", a);
    if (autograd::requires_grad(a)) node->save("b", b);
    autograd::record(node, {a, b}, {out});
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("div", a, b, fn::Div{});
  if (autograd::needs_grad({a, b})) {
    auto node = std::make_shared<LambdaNode>("DivBackward", [](const std::vector<Tensor>& g, const LambdaNode& self) {
      const Tensor b = self.saved_tensor("b");
      Tensor gb;
      if (self.needs_input_grad(1)) {
        const Tensor a = self.saved_tensor("a");
        gb = empty(g[0].shape(), ops::options_of(g[0]));
        ops::run_ternary(gb, g[0], raw::expand(ops::as_dtype(a, g[0].dtype()), g[0].shape()),
                         raw::expand(ops::as_dtype(b, g[0].dtype()), g[0].shape()), "div", fn::DivGradY{});
      }
      return reduce_to_inputs(self, self.needs_input_grad(0) ? div(g[0], b) : Tensor(), gb);
    });
    if (autograd::requires_grad(b)) node->save("a", a);
    node->save("b", b);
    autograd::record(node, {a, b}, {out});
  }
  return out;
}

// ---- with a scalar ----

Tensor add(const Tensor& a, double s) {
  Tensor out = map_unary("add", a, fn::AddScalar{s});
  if (autograd::needs_grad({a})) {
    auto node = std::make_shared<LambdaNode>(
        "AddScalarBackward", [](const std::vector<Tensor>& g, const LambdaNode&) { return std::vector<Tensor>{g[0]}; });
    autograd::record(node, {a}, {out});
  }
  return out;
}

Tensor mul(const Tensor& a, double s) {
  Tensor out = map_unary("mul", a, fn::MulScalar{s});
  if (autograd::needs_grad({a})) {
    auto node = std::make_shared<LambdaNode>("MulScalarBackward", [s](const std::vector<Tensor>& g, const LambdaNode&) {
      return std::vector<Tensor>{mul(g[0], s)};
    });
    autograd::record(node, {a}, {out});
  }
  return out;
}

Tensor rdiv(double s, const Tensor& a) {
  return unary_op("rdiv", a, fn::RDivScalar{s}, fn::RDivScalarGrad{s}, Saved::input);
}

// ---- unary math ----

Tensor neg(const Tensor& x) { return mul(x, -1.0); }
Tensor exp(const Tensor& x) { return unary_op("exp", x, fn::Exp{}, fn::ExpGrad{}, Saved::output); }
Tensor log(const Tensor& x) { return unary_op("log", x, fn::Log{}, fn::LogGrad{}, Saved::input); }
Tensor sqrt(const Tensor& x) { return unary_op("sqrt", x, fn::Sqrt{}, fn::SqrtGrad{}, Saved::output); }
Tensor rsqrt(const Tensor& x) { return unary_op("rsqrt", x, fn::Rsqrt{}, fn::RsqrtGrad{}, Saved::output); }
Tensor pow(const Tensor& x, double p) {
  return unary_op("pow", x, fn::PowScalar{p}, fn::PowScalarGrad{p}, Saved::input);
}
Tensor abs(const Tensor& x) { return unary_op("abs", x, fn::Abs{}, fn::AbsGrad{}, Saved::input); }
Tensor tanh(const Tensor& x) { return unary_op("tanh", x, fn::Tanh{}, fn::TanhGrad{}, Saved::output); }
Tensor sigmoid(const Tensor& x) { return unary_op("sigmoid", x, fn::Sigmoid{}, fn::SigmoidGrad{}, Saved::output); }
Tensor relu(const Tensor& x) { return unary_op("relu", x, fn::Relu{}, fn::ReluGrad{}, Saved::input); }
Tensor silu(const Tensor& x) { return unary_op("silu", x, fn::Silu{}, fn::SiluGrad{}, Saved::input); }

Tensor gelu(const Tensor& x, GeluApproximation approximation) {
  return approximation == GeluApproximation::tanh
             ? unary_op("gelu", x, fn::GeluTanh{}, fn::GeluTanhGrad{}, Saved::input)
             : unary_op("gelu", x, fn::GeluErf{}, fn::GeluErfGrad{}, Saved::input);
}

// ---- operators ----

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double s) { return add(a, s); }
Tensor operator+(double s, const Tensor& a) { return add(a, s); }
Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
Tensor operator-(double s, const Tensor& a) { return add(neg(a), s); }
Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
Tensor operator/(double s, const Tensor& a) { return rdiv(s, a); }
Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace mt
