// The small Llama the nn tests build: 2 layers, width 24, 6 query heads sharing 2 key/value heads,
// MLP 40 wide, 37 tokens, 32 positions.
#pragma once

#include "ops/nn/llama_config.h"

namespace mt::nn {

inline LlamaConfig tiny_llama_config() {
  LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  return c;
}

}  // namespace mt::nn
