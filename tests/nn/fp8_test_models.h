// What the FP8 nn tests share: the tiny GPT whose GEMM sides are all multiples of 16 (FP8's rule),
// a batch of its tokens, the Linear layers of a model, and the mean of a loss curve's tail.
#pragma once

#include <cstddef>
#include <vector>

#include "core/tensor.h"
#include "ops/nn/gpt.h"
#include "ops/nn/layers.h"

namespace mt::nn {

// Width 32, 3C 96, MLP 128, 2 heads, 2 layers, 37 tokens, 16 positions; the head is bf16 anyway.
inline GPTConfig fp8_gpt_config() {
  GPTConfig c;
  c.vocab_size = 37;
  c.n_positions = 16;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 2;
  return c;
}

inline Device cuda0() { return Device(DeviceType::cuda, 0); }

// [4, 17] tokens, each row following t -> (5 t + 3) mod 37 from its own start: inputs and targets.
struct TokenBatch {
  Tensor x, y;
};
inline TokenBatch make_batch(Device device) {
  std::vector<double> ids;
  for (int row = 0; row < 4; ++row) {
    int t = 7 * row + 1;
    for (int i = 0; i < 17; ++i, t = (5 * t + 3) % 37) ids.push_back(t);
  }
  const Tensor seq = from_vector(ids, {4, 17}, DType::i64).to(device);
  return {seq.slice(1, 0, 16), seq.slice(1, 1, 17)};
}

// Every Linear of m (LoRA factors included), in named_modules' order.
inline std::vector<Linear*> linears_of(const Module& m) {
  std::vector<Linear*> out;
  for (const auto& [path, child] : m.named_modules()) {
    if (auto* l = dynamic_cast<Linear*>(child.get())) out.push_back(l);
  }
  return out;
}

// The mean of the last n values.
inline double mean_of_last(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

}  // namespace mt::nn
