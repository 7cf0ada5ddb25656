// The configuration of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM), read from a
// Hugging Face config.json of model_type "llama", "mistral" or "qwen2".
//
// Every field the architecture depends on is read; a value this implementation does not run
// (another activation, another rope_scaling type, an MLP bias, pretraining_tp > 1, ...) is a
// FileError naming the file and the field, never ignored. Mistral's and Qwen2's sliding window
// is kept and checked against each sequence: attention over a window shorter than the sequence
// is not implemented, so such a forward is refused instead of computing something else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mt::nn {

struct RopeScaling {  // rope_scaling {"rope_type": "llama3", ...} (Llama 3.1 / 3.2)
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  std::string model_type = "llama";
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // < heads: grouped-query attention
  int64_t head_dim = 0;              // 0: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q, k, v (and o for llama) biases; Qwen2: q, k, v only
  bool o_proj_bias = false;
  std::optional<int64_t> sliding_window;  // Mistral / Qwen2, when in use
  std::optional<int64_t> bos_token_id, eos_token_id;

  int64_t dim_per_head() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  void validate() const;  // throws naming the field and its value
  static LlamaConfig from_json_file(const std::string& path);
  std::string to_json() const;
};

// The model_type of a config.json ("gpt2", "llama", ...), for programs that take any model.
std::string model_type_of(const std::string& config_path);

}  // namespace mt::nn
