// The rotary position embeddings of a Llama-family config: the inverse frequencies
//
//   inv_freq[i] = 1 / theta^(2i / D), i in [0, D/2)      (rescaled by rope_scaling "llama3")
//
// computed in f32 as transformers computes them (so positions far from 0 round the same way),
// and kept on each device a model runs on; ops/rope/rope.h rotates q and k with them.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/nn/llama_config.h"

namespace mt::nn {

std::vector<float> rope_inverse_frequencies(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling);

// Where the tokens of one forward pass sit: positions start, start + 1, ... along each row (a KV
// cache's length is the start of the tokens after it), or, for packed rows, positions of their own
// and the attention mask that keeps their sequences apart.
struct TokenLayout {
  int64_t start = 0;
  Tensor positions;  // [B, T] i64, or undefined: start + t
  Tensor attn_mask;  // [B, 1, T, T] additive bias (mt::attention_bias), or undefined: causal alone
};

class RotaryEmbedding {
 public:
  RotaryEmbedding(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling);
  // inv_freq [D/2] f32 on `device`, copied there on first use and kept: every layer of every
  // step asks, and a copy from the host each time would wait for the device.
  const Tensor& inv_freq(Device device) const;
  // x [B, H, T, D] rotated for the layout's positions (mt::rope).
  Tensor apply(const Tensor& x, const TokenLayout& layout) const;

 private:
  std::vector<float> host_;
  mutable std::mutex mutex_;
  mutable std::map<std::pair<int, int>, Tensor> on_device_;  // (device type, index) -> inv_freq
};

}  // namespace mt::nn
