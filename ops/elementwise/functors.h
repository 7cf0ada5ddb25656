// The formulas of the element-wise ops, each forward next to its derivative.
// One struct per formula, used by the CPU loops (ops/loops.h) and the CUDA loops
// (ops/cuda/loops.cuh) alike. Arguments and results are in acc_t<T>.
//   Forward functors take x (and y); derivative functors take (grad, saved) and
//   return the input gradient.
#pragma once

#include "core/macros.h"
#include "ops/math.h"

namespace mt::fn {

// ---- binary arithmetic ----
struct Add {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x, A y) const {
    return x + y;
  }
};
struct Sub {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x, A y) const {
    return x - y;
  }
};
struct Mul {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x, A y) const {
    return x * y;
  }
};
// x * x, the product of a tensor with itself, and its derivative (grad, x): g x + g x, the sum
// the two gradients of a product would make, from one kernel.
struct Square {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return x * x;
  }
};
struct SquareGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    const A gx = g * x;
    return gx + gx;
  }
};
struct Div {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x, A y) const {
    return x / y;
  }
};
// d(x / y)/dy = -x / y^2, written as -grad * x / (y * y); ternary (grad, x, y).
struct DivGradY {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x, A y) const {
    return -g * x / (y * y);
  }
};

// ---- with a scalar ----
struct AddScalar {
  double s;
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return x + static_cast<A>(s);
  }
};
struct MulScalar {
  double s;
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return x * static_cast<A>(s);
  }
};
// s / x and its derivative -s / x^2 (grad, x)
struct RDivScalar {
  double s;
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return static_cast<A>(s) / x;
  }
};
struct RDivScalarGrad {
  double s;
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    return -g * static_cast<A>(s) / (x * x);
  }
};
// x^p with PyTorch's special exponents: 2, 3, -1 and -2 as products, 0.5 and -0.5 as sqrt and
// its reciprocal. They are faster, and they fix the values at the edges: pow(-inf, 0.5) is NaN,
// as sqrt(-inf) is, where C's pow gives inf.
template <typename A>
MT_HOST_DEVICE A pow_scalar(A x, A p) {
  if (p == A(2)) return x * x;
  if (p == A(3)) return x * x * x;
  if (p == A(-1)) return A(1) / x;
  if (p == A(-2)) return A(1) / (x * x);
  if (p == A(0.5)) return math::sqrt(x);
  if (p == A(-0.5)) return A(1) / math::sqrt(x);
  return math::pow(x, p);
}
struct PowScalar {
  double p;
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return pow_scalar(x, static_cast<A>(p));
  }
};
struct PowScalarGrad {  // (grad, x)
  double p;
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    return p == 0.0 ? A(0) : g * static_cast<A>(p) * pow_scalar(x, static_cast<A>(p - 1.0));
  }
};

// ---- unary math ----
struct Neg {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return -x;
  }
};
struct Exp {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return math::exp(x);
  }
};
struct Log {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return math::log(x);
  }
};
struct Sqrt {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return math::sqrt(x);
  }
};
struct Rsqrt {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return A(1) / math::sqrt(x);
  }
};
struct Abs {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return math::abs(x);
  }
};
struct Tanh {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return math::tanh(x);
  }
};
struct Sigmoid {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return A(1) / (A(1) + math::exp(-x));
  }
};
// relu(NaN) = NaN, as in PyTorch: the test is written so that a NaN fails it and passes through,
// never `x > 0 ? x : 0`, which would turn an overflow's NaN into a silent 0.
struct Relu {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return x <= A(0) ? A(0) : x;
  }
};
struct Silu {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return x / (A(1) + math::exp(-x));
  }
};
// GELU, exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
struct GeluErf {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    return A(0.5) * x * (A(1) + math::erf(x * A(0.70710678118654752440)));
  }
};
// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct GeluTanh {
  template <typename A>
  MT_HOST_DEVICE A operator()(A x) const {
    const A inner = A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
    return A(0.5) * x * (A(1) + math::tanh(inner));
  }
};

// ---- derivatives: (grad, saved) -> input gradient; `saved` is named per op ----
struct ExpGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A y) const {
    return g * y;
  }
};  // y = exp x
struct LogGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    return g / x;
  }
};
struct SqrtGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A y) const {
    return g / (A(2) * y);
  }
};
struct RsqrtGrad {  // y = x^-1/2: dy/dx = -y^3 / 2
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A y) const {
    return A(-0.5) * g * y * y * y;
  }
};
// g * sign(x), a product as in PyTorch (sign(NaN) = sign(0) = 0): a non-finite g stays visible
// (inf * 0 = NaN) instead of being selected away.
struct AbsGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    return g * (x > A(0) ? A(1) : (x < A(0) ? A(-1) : A(0)));
  }
};
struct TanhGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A y) const {
    return g * (A(1) - y * y);
  }
};
struct SigmoidGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A y) const {
    return g * y * (A(1) - y);
  }
};
// PyTorch's threshold_backward: the gradient is zeroed only where x <= 0, so at x = NaN it passes.
struct ReluGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    return x <= A(0) ? A(0) : g;
  }
};
struct SiluGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    const A s = A(1) / (A(1) + math::exp(-x));
    return g * s * (A(1) + x * (A(1) - s));
  }
};
struct GeluErfGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    const A cdf = A(0.5) * (A(1) + math::erf(x * A(0.70710678118654752440)));
    const A pdf = A(0.39894228040143267794) * math::exp(A(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
struct GeluTanhGrad {
  template <typename A>
  MT_HOST_DEVICE A operator()(A g, A x) const {
    const A k = A(0.79788456080286535588);
    const A inner = k * (x + A(0.044715) * x * x * x);
    const A t = math::tanh(inner);
    const A dinner = k * (A(1) + A(3) * A(0.044715) * x * x);
    return g * (A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner);
  }
};

}  // namespace mt::fn
