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

RopeTables rope_tables(int64_t seq_len, int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling,
                       Device device, int64_t start) {
  const auto inv = rope_inverse_frequencies(head_dim, theta, scaling);
  const int64_t half = head_dim / 2;
  std::vector<double> cos(static_cast<size_t>(seq_len * head_dim)), sin(cos.size());
  for (int64_t t = 0; t < seq_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(start + t) * inv[static_cast<size_t>(i)];
      for (const int64_t col : {i, i + half}) {
        cos[static_cast<size_t>(t * head_dim + col)] = std::cos(static_cast<double>(angle));
        sin[static_cast<size_t>(t * head_dim + col)] = std::sin(static_cast<double>(angle));
      }
    }
  }
  const auto options = TensorOptions().dtype(DType::f32).device(device);
  return {from_vector(cos, {seq_len, head_dim}, options), from_vector(sin, {seq_len, head_dim}, options)};
}

Tensor apply_rope(const Tensor& x, const RopeTables& tables) {
  MT_CHECK_T(
      ShapeError,
      x.dim() == 4 && tables.cos.dim() == 2 && x.size(2) == tables.cos.size(0) && x.size(3) == tables.cos.size(1),
      "apply_rope: x ", shape_str(x.shape()), " does not fit tables ", shape_str(tables.cos.shape()));
  const int64_t d = x.size(3), half = d / 2;
  const Tensor rotated = cat({neg(slice(x, 3, half, d)), slice(x, 3, 0, half)}, 3);
  const Tensor cos = tables.cos.dtype() == x.dtype() ? tables.cos : cast(tables.cos, x.dtype());
  const Tensor sin = tables.sin.dtype() == x.dtype() ? tables.sin : cast(tables.sin, x.dtype());
  return add(mul(x, cos), mul(rotated, sin));
}

}  // namespace mt::nn
