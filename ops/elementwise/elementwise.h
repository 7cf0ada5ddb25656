// Element-wise ops with NumPy broadcasting. Inputs of different floating dtypes
// are promoted to the wider one (promote_types); the output has the broadcast
// shape. Math runs in f32 for f16/bf16 inputs and in f64 for f64.
// Every op here is differentiable; the gradient of a broadcast input is summed
// over the broadcast dimensions.
#pragma once

#include "core/tensor.h"

namespace mt {

Tensor add(const Tensor& a, const Tensor& b);  // a + b
Tensor sub(const Tensor& a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, const Tensor& b);  // a * b
Tensor div(const Tensor& a, const Tensor& b);  // a / b
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor rdiv(double s, const Tensor& a);  // s / a

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);          // 1 / sqrt(x)
Tensor pow(const Tensor& x, double p);  // x^p (scalar exponent)
Tensor abs(const Tensor& x);            // gradient 0 at 0
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);                 // gradient 0 at 0
Tensor silu(const Tensor& x);                 // x * sigmoid(x)
enum class GeluApproximation { none, tanh };  // none: x * Phi(x) with erf; tanh: GPT-2's form
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::none);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(const Tensor& a, double s);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(const Tensor& a, double s);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(const Tensor& a, double s);
Tensor operator/(double s, const Tensor& a);
Tensor operator-(const Tensor& x);

}  // namespace mt
