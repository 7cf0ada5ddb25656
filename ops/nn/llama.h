// Llama-family decoders (Llama 2/3, Mistral, Qwen2, SmolLM): Hugging Face's LlamaForCausalLM.
//
//   ids     // [B, T] i64
//   x = embed_tokens[ids]                                          // [B, T, C]
//   layer:  x = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = input_layernorm(x)
//           x = x + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(x)
//   logits = lm_head(norm(x))    // [B, T, V]; lm_head is embed_tokens with tie_word_embeddings
//
// Norms are RMSNorm; attention is causal with H query heads sharing Hkv key/value heads
// (grouped-query: query head h reads kv head h / (H / Hkv)), scale 1/sqrt(D).
// Parameter paths are transformers' ("model.layers.0.self_attn.q_proj.weight"), so LoRA targets
// (q_proj, ..., down_proj) and adapters line up with PEFT's.
#pragma once

#include <memory>
#include <string>

#include "core/random.h"
#include "ops/matmul/matmul.h"
#include "ops/nn/causal_lm.h"
#include "ops/nn/gpt.h"
#include "ops/nn/layers.h"
#include "ops/nn/llama_config.h"
#include "ops/nn/rope.h"

namespace mt::nn {

// y = x / rms(x) * weight over the last dimension; weight ones.
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps);
  Tensor forward(const Tensor& x) const;
  // {x + delta, forward(x + delta)} in one pass (add_rms_norm): a residual add and this norm.
  AddNorm forward_add(const Tensor& x, const Tensor& delta) const;
  Tensor weight;  // [dim]
  double eps;
};

class LlamaAttention : public Module {
 public:
  LlamaAttention(const LlamaConfig& config, Generator* generator);
  // [B, T, C] -> [B, T, C]. With a cache (keys/values of the positions before x's), x's keys and
  // values are appended to it and x attends to all of them.
  // The tokens sit where `layout` says (after the cache's when there is one).
  Tensor forward(const Tensor& x, const RotaryEmbedding& rope, const TokenLayout& layout, Tensor* cached_k = nullptr,
                 Tensor* cached_v = nullptr) const;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  int64_t n_head, n_kv_head, head_dim;
};

class LlamaMLP : public Module {
 public:
  LlamaMLP(const LlamaConfig& config, Generator* generator);
  // down_proj(swiglu(gate_proj(x), up_proj(x))): silu(gate) * up; with OutputValues::unread, the
  // down projection recorded with its output unwritten (Linear::forward_unread).
  Tensor forward(const Tensor& x, OutputValues values = OutputValues::computed) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, Generator* generator);
  // The residual stream after this layer is x + pending + attention + MLP. `pending` (the layer
  // before's MLP output, or undefined) and the attention output are added by the norms after them
  // (add_rms_norm: one pass over the stream instead of two); the MLP output is returned as the
  // next pending delta: {stream before it, MLP output}. A checkpointed layer's recomputation
  // passes OutputValues::unread for that MLP output, which nothing in the layer reads: its down
  // projection's GEMM (the base GEMM, under LoRA) is then skipped, a quarter of the layer's GEMMs.
  AddNorm forward(const Tensor& x, const Tensor& pending, const RotaryEmbedding& rope, const TokenLayout& layout,
                  Tensor* cached_k = nullptr, Tensor* cached_v = nullptr,
                  OutputValues mlp_output = OutputValues::computed) const;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
};

// transformers' LlamaModel, registered as "model".
class LlamaModel : public Module {
 public:
  LlamaModel(const LlamaConfig& config, Generator* generator);
  // [B, T] -> hidden [B, T, C] after the final norm; with `packed`, rows of several sequences
  // (never with a cache).
  Tensor forward(const Tensor& ids, KVCache* cache = nullptr, const PackedSequences* packed = nullptr) const;
  std::shared_ptr<Embedding> embed_tokens;
  std::shared_ptr<ModuleList> layers_list;
  std::vector<std::shared_ptr<LlamaDecoderLayer>> layers;
  std::shared_ptr<RMSNorm> norm;
  GPTCheckpointing checkpointing;  // blocks, blocks:K, layers:N recompute layers in backward; never with a cache

 private:
  LlamaConfig config_;
  std::shared_ptr<const RotaryEmbedding> rotary_;
};

class Llama : public CausalLM {
 public:
  // Weights N(0, 0.02) (transformers' initializer_range), biases zero, norms one.
  explicit Llama(const LlamaConfig& config, Generator* generator = nullptr);
  Tensor forward(const Tensor& ids) const override;                      // [B, T] -> logits [B, T, V]
  Tensor loss(const Tensor& ids, const Tensor& targets) const override;  // mean cross-entropy over targets != -100
  bool supports_packing() const override { return true; }
  Tensor packed_loss(const Tensor& ids, const Tensor& targets, const PackedSequences& packed) const override;
  const LlamaConfig& config() const { return config_; }
  // CausalLM
  std::string model_type() const override { return config_.model_type; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_positions() const override { return config_.max_position_embeddings; }
  int64_t num_layers() const override { return config_.num_hidden_layers; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  void save_pretrained(const std::string& dir) const override { save_pretrained(dir, int64_t{5} << 30); }
  std::string config_json() const override { return config_.to_json(); }
  bool has_kv_cache() const override { return true; }
  // "off", "blocks" (every layer but the last recomputed in backward), "blocks:K" (every K-th) or
  // "layers:N" (N layers, spread evenly).
  void set_checkpointing(const std::string& mode) override;
  std::string checkpointing() const override { return model->checkpointing.str(); }
  Tensor forward_cached(const Tensor& ids, KVCache& cache) const override;
  const Tensor& lm_head_weight() const;  // [V, C]: lm_head's, or the embedding's when tied

  // A Hugging Face directory: config.json and model.safetensors or its shards. The weights keep
  // the checkpoint's dtype (a bf16 checkpoint is a bf16 model).
  static std::shared_ptr<Llama> from_pretrained(const std::string& dir);
  // Writes config.json and the weights, sharded when larger than max_shard_bytes.
  void save_pretrained(const std::string& dir, int64_t max_shard_bytes) const;

  std::shared_ptr<LlamaModel> model;
  std::shared_ptr<Linear> lm_head;  // null when tied; fp8_excluded (the head stays bf16 under FP8)

 private:
  // Mean cross-entropy over targets != -100, of plain or packed rows; `what` names the caller in errors.
  Tensor token_loss(const char* what, const Tensor& ids, const Tensor& targets, const PackedSequences* packed) const;
  LlamaConfig config_;
};

}  // namespace mt::nn
