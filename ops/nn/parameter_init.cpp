#include "ops/nn/parameter_init.h"

#include "ops/elementwise/elementwise.h"

namespace mt::nn {
namespace {

ParameterInit& current() {
  thread_local ParameterInit init;
  return init;
}

}  // namespace

const ParameterInit& parameter_init() { return current(); }

ParameterInitGuard::ParameterInitGuard(const ParameterInit& init) : previous_(current()) { current() = init; }

ParameterInitGuard::~ParameterInitGuard() { current() = previous_; }

Tensor init_uniform(const Shape& shape, double low, double high, Generator* generator) {
  const ParameterInit& init = current();
  return init.random ? uniform(shape, low, high, init.options, generator) : empty(shape, init.options);
}

Tensor init_normal(const Shape& shape, double std, Generator* generator) {
  const ParameterInit& init = current();
  if (!init.random) return empty(shape, init.options);
  // Drawn in f32 and scaled before the one rounding into a half-precision dtype.
  const Tensor drawn = mul(randn(shape, TensorOptions(DType::f32).device(init.options.device()), generator), std);
  return drawn.dtype() == init.options.dtype() ? drawn : drawn.to(init.options.dtype());
}

Tensor init_constant(const Shape& shape, double value) {
  const ParameterInit& init = current();
  const Tensor t = empty(shape, init.options);
  if (init.random) t.fill_(value);
  return t;
}

}  // namespace mt::nn
