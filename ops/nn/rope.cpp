#include "ops/nn/rope.h"

#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace mt::nn {

std::vector<float> rope_inverse_frequencies(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  if (!scaling) return inv;
  // Llama 3.1's rescaling: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
  const double old_len = static_cast<double>(scaling->original_max_position_embeddings);
  const double low_wavelen = old_len / scaling->low_freq_factor, high_wavelen = old_len / scaling->high_freq_factor;
  for (float& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / scaling->factor);
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - scaling->low_freq_factor) / (scaling->high_freq_factor - scaling->low_freq_factor);
      f = static_cast<float>((1 - smooth) * f / scaling->factor + smooth * f);
    }
  }
  return inv;
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling)
    : host_(rope_inverse_frequencies(head_dim, theta, scaling)) {}

const Tensor& RotaryEmbedding::inv_freq(Device device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Tensor& t = on_device_[{static_cast<int>(device.type), device.index}];
  if (!t.defined()) {
    const std::vector<double> values(host_.begin(), host_.end());
    t = from_vector(values, {static_cast<int64_t>(values.size())}, TensorOptions().dtype(DType::f32).device(device));
  }
  return t;
}

Tensor RotaryEmbedding::apply(const Tensor& x, const TokenLayout& layout) const {
  if (layout.positions.defined()) return rope(x, inv_freq(x.device()), layout.positions);
  return rope(x, inv_freq(x.device()), layout.start);
}

}  // namespace mt::nn
