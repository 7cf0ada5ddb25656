// Rotary position embeddings as Llama-family models apply them (Hugging Face's rotate_half form):
//
//   inv_freq[i] = 1 / theta^(2i / D), i in [0, D/2)      (rescaled by rope_scaling "llama3")
//   angle[t, i] = t * inv_freq[i];  cos, sin: [T, D] = [cos(angle), cos(angle)] (the half repeated)
//   rope(x)     = x * cos + rotate_half(x) * sin,  rotate_half([x1, x2]) = [-x2, x1]
//
// inv_freq and the angles are computed in f32 as transformers computes them, so positions far
// from 0 round the same way; cos and sin are then exact roundings of those f32 angles.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "ops/nn/llama_config.h"

namespace mt::nn {

struct RopeTables {
  Tensor cos, sin;  // [T, D] f32, on the device asked for
};

std::vector<float> rope_inverse_frequencies(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling);
// Rows for positions [start, start + seq_len): a cached generation step's positions follow the cache.
RopeTables rope_tables(int64_t seq_len, int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling,
                       Device device, int64_t start = 0);

// x: [B, H, T, D]; cos, sin: [T, D] (cast to x's dtype). Differentiable.
Tensor apply_rope(const Tensor& x, const RopeTables& tables);

}  // namespace mt::nn
