#include "core/random.h"

#include <map>
#include <mutex>

#include "core/kernels.h"

namespace mt {

namespace {
std::mutex g_generators_mutex;
std::map<std::pair<int, int>, Generator>& generators() {
  static std::map<std::pair<int, int>, Generator> g;  // (device type, index) -> generator
  return g;
}

Tensor draw(const Shape& shape, TensorOptions options, Generator* generator, kernels::Distribution dist, double a,
            double b) {
  MT_CHECK_T(DTypeError, is_compute_floating(options.dtype()),
             dist == kernels::Distribution::uniform ? "rand" : "randn", ": dtype ", dtype_name(options.dtype()),
             " is not a floating type (use f64, f32, f16 or bf16)");
  Tensor t = empty(shape, options.requires_grad(false));
  Generator& gen = generator ? *generator : default_generator(options.device());
  const uint64_t offset = gen.advance(static_cast<uint64_t>(t.numel()));
  if (t.is_cuda()) {
    kernels::random_cuda(t, dist, a, b, gen.seed(), offset);
  } else {
    kernels::random_cpu(t, dist, a, b, gen.seed(), offset);
  }
  return detail::apply_requires_grad(std::move(t), options);
}
}  // namespace

Generator& default_generator(Device device) {
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  return generators()[{static_cast<int>(device.type), device.index}];
}

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  generators()[{static_cast<int>(DeviceType::cpu), 0}].manual_seed(seed);
  for (int d = 0; d < cuda::device_count(); ++d)
    generators()[{static_cast<int>(DeviceType::cuda), d}].manual_seed(seed);
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* generator) {
  return draw(shape, options, generator, kernels::Distribution::uniform, 0.0, 1.0);
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* generator) {
  return draw(shape, options, generator, kernels::Distribution::normal, 0.0, 1.0);
}

Tensor uniform(const Shape& shape, double low, double high, TensorOptions options, Generator* generator) {
  MT_CHECK(low < high, "uniform: low (", low, ") must be below high (", high, ")");
  return draw(shape, options, generator, kernels::Distribution::uniform, low, high);
}

}  // namespace mt
