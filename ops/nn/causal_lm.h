// What training, fine-tuning and sampling need of a decoder-only language model, whatever its
// architecture (GPT-2, the Llama family), and loading one from a Hugging Face directory by the
// model_type its config.json names. Programs written against CausalLM take any of them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/random.h"
#include "ops/nn/module.h"

namespace mt::nn {

// Keys and values of the tokens a model has seen, per layer, so that generation feeds one new
// token a step instead of the whole context (KV cache).
struct KVCache {
  std::vector<Tensor> keys, values;  // [layers] of [B, Hkv, length, D]; undefined before the first step
  int64_t length = 0;                // tokens cached
};

// Rows that each hold several sequences (packed fine-tuning examples, mt::data::PackedBatcher):
// positions restart at every sequence, and attention never crosses from one into another, so
// each sequence is computed as it would be alone in its own row.
struct PackedSequences {
  Tensor positions;  // [B, T] i64: each token's position within its own sequence
  Tensor segments;   // [B, T] i64: the tokens of one sequence share an id
};

class CausalLM : public Module {
 public:
  virtual Tensor forward(const Tensor& ids) const = 0;                      // [B, T] -> logits [B, T, V]
  virtual Tensor loss(const Tensor& ids, const Tensor& targets) const = 0;  // mean over targets != -100
  // loss() over packed rows. Models without packing return false and throw naming their type.
  virtual bool supports_packing() const { return false; }
  virtual Tensor packed_loss(const Tensor& ids, const Tensor& targets, const PackedSequences& packed) const;
  virtual std::string model_type() const = 0;  // config.json's
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_positions() const = 0;  // the longest sequence
  virtual int64_t num_layers() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual double dropout() const { return 0.0; }
  // Gradient checkpointing: "off", "blocks", "blocks:K", "layers:N", "selective" where the model has them;
  // a mode it lacks throws naming it.
  virtual void set_checkpointing(const std::string& mode);
  virtual std::string checkpointing() const { return "off"; }
  // PEFT adapters of this model store LoRA factors transposed (GPT-2's Conv1D layers).
  virtual bool adapters_fan_in_fan_out() const { return false; }
  virtual void save_pretrained(const std::string& dir) const = 0;
  virtual std::string config_json() const = 0;  // what save_pretrained writes as config.json
  // Logits of `ids` [B, T] following the `cache.length` tokens already in `cache`, which then holds
  // them too: a whole prompt into an empty cache, then one token at a time. Models without a cache
  // return false from has_kv_cache() and throw here.
  virtual bool has_kv_cache() const { return false; }
  virtual Tensor forward_cached(const Tensor& ids, KVCache& cache) const;
};

// config.json's model_type: "gpt2" -> GPT, "llama" / "mistral" / "qwen2" -> Llama. Throws
// FileError naming the config for any other type.
std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir);

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;               // 0: greedy
  int64_t top_k = 0;                      // 0: the whole vocabulary
  double top_p = 1.0;                     // nucleus: the most likely tokens whose probabilities add up to top_p
  std::optional<int64_t> stop_token;      // generation ends after it
  std::function<void(int64_t)> on_token;  // called with each new token as it is drawn (streaming)
  bool use_cache = true;                  // a KV cache where the model has one
};

// Extends `prompt` by sampling one token at a time (no gradient, eval mode assumed by the caller).
// With a KV cache the prompt runs once and each step feeds one token, until the context reaches
// max_positions(); without one (or past that), each step runs the last max_positions() tokens.
std::vector<int64_t> generate(const CausalLM& model, std::vector<int64_t> prompt, const GenerateOptions& options,
                              Generator* generator = nullptr);

}  // namespace mt::nn
