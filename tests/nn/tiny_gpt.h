// The small GPT the nn tests build: 2 layers, width 24, 3 heads, 37 tokens, context 16.
#pragma once

#include "ops/nn/gpt.h"

namespace mt::nn {

inline GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab_size = 37;
  c.n_positions = 16;
  c.n_embd = 24;
  c.n_layer = 2;
  c.n_head = 3;
  return c;
}

}  // namespace mt::nn
