// GPT: the GPT-2 architecture (learned positions, pre-norm blocks, GELU-tanh MLP,
// LM head tied to the token embedding), built from a config, trained from scratch
// or loaded from a Hugging Face GPT-2 checkpoint.
//
//   ids      // [B, T] i64, T <= n_positions
//   logits   // [B, T, V] = ln_f(blocks(wte[ids] + wpe[0..T))) wte^T
//
// Parameter paths are Hugging Face's GPT2LMHeadModel paths ("transformer.h.0.attn.c_attn.weight"),
// so LoRA targets ("c_attn", "c_proj", "c_fc") and saved adapters line up with PEFT. The one
// difference is the projection layout: HF's Conv1D stores [in, out], our Linear [out, in];
// from_pretrained() / save_pretrained() transpose on the way in and out, and nothing else does.
// A directory written by save_pretrained() loads with transformers' GPT2LMHeadModel.from_pretrained.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "ops/nn/causal_lm.h"
#include "ops/nn/layers.h"
#include "ops/nn/transformer.h"

namespace mt::nn {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;  // the longest sequence
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;   // MLP width; 0 means 4 * n_embd, as in HF
  double dropout = 0.0;  // HF's resid_pdrop, embd_pdrop and attn_pdrop, which must agree on load
  double layer_norm_epsilon = 1e-5;

  void validate() const;  // throws naming the field and its value
  int64_t mlp_width() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  // HF config.json: reading checks model_type and the options we do not implement.
  static GPTConfig from_json_file(const std::string& path);
  std::string to_json() const;
};

// Gradient checkpointing of the blocks (autograd/checkpoint.h), set by GPT::set_checkpointing:
//   off        every activation is kept
//   blocks     every `every`-th block but the last keeps only its input and is recomputed
//              in backward (every = 1: all of them; the most memory saved, one extra forward
//              of the blocks; see Block::forward_checkpointed for what a frozen MLP skips)
//   selective  each block keeps its GEMM outputs and recomputes only the attention core, whose
//              [B, H, T, T] scores and probabilities dominate memory at long T (Korthikanti et al. 2022)
// Which blocks backward recomputes. blocks: every `every`-th block; layers: `count` blocks spread
// evenly (what a memory budget asks for: each recomputed block frees the same bytes). The last
// block is never recomputed: backward reaches it first and would rebuild at once what keeping it
// holds. selective recomputes the attention core of every block instead.
struct GPTCheckpointing {
  enum class Mode { off, blocks, layers, selective };
  Mode mode = Mode::off;
  int64_t every = 1;  // blocks
  int64_t count = 0;  // layers
  // "off", "blocks", "blocks:K", "layers:N", "selective"
  static GPTCheckpointing parse(const std::string& text);
  std::string str() const;
  bool recomputes(int64_t block, int64_t n_blocks) const;  // block in [0, n_blocks)
  int64_t recomputed(int64_t n_blocks) const;              // how many blocks recomputes() picks
};

// The body: HF's GPT2Model, registered as "transformer".
class GPTBody : public Module {
 public:
  GPTBody(const GPTConfig& config, Generator* generator);
  // [B, T] -> hidden [B, T, C] after ln_f (autocast dtype under autocast). With a cache, ids follow
  // its cache->length tokens (positions from there) and their keys and values join it.
  Tensor forward(const Tensor& ids, KVCache* cache = nullptr) const;
  std::shared_ptr<Embedding> wte;  // [V, C]
  std::shared_ptr<Embedding> wpe;  // [n_positions, C]
  std::shared_ptr<ModuleList> h;
  std::vector<std::shared_ptr<Block>> blocks;  // h's children, typed
  std::shared_ptr<LayerNorm> ln_f;
  double dropout;
  GPTCheckpointing checkpointing;
};

class GPT : public CausalLM {
 public:
  // Weights drawn as GPT-2 draws them: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)),
  // biases zero, layer norms (1, 0).
  explicit GPT(const GPTConfig& config, Generator* generator = nullptr);

  Tensor forward(const Tensor& ids) const override;                      // [B, T] -> logits [B, T, V]
  Tensor loss(const Tensor& ids, const Tensor& targets) const override;  // mean cross-entropy over [B, T]
  const GPTConfig& config() const { return config_; }
  void set_checkpointing(const GPTCheckpointing& checkpointing);
  // CausalLM
  std::string model_type() const override { return "gpt2"; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_positions() const override { return config_.n_positions; }
  int64_t num_layers() const override { return config_.n_layer; }
  int64_t hidden_size() const override { return config_.n_embd; }
  double dropout() const override { return config_.dropout; }
  void set_checkpointing(const std::string& mode) override { set_checkpointing(GPTCheckpointing::parse(mode)); }
  bool has_kv_cache() const override { return true; }
  Tensor forward_cached(const Tensor& ids, KVCache& cache) const override;
  std::string checkpointing() const override { return transformer->checkpointing.str(); }
  bool adapters_fan_in_fan_out() const override { return true; }  // HF's Conv1D
  std::string config_json() const override { return config_.to_json(); }
  // On (the default): residual adds fused into the norms after them (add_layer_norm) and each
  // MLP one mlp_gelu. Off: separate add, layer_norm, linear_gelu and linear ops, the same
  // values while the residual stream is f32 (f32 parameters, with or without autocast); for
  // measuring what the fusions buy (tools/bench/gpt_step --unfused).
  void set_fused_ops(bool on);
  // Rows of logits loss() forms at a time (LinearCrossEntropyOptions::chunk_rows; 0: the op's
  // default). Fewer, larger chunks run the head's GEMMs at a better rate for more memory.
  int64_t head_chunk_rows = 0;

  // A Hugging Face GPT-2 directory: config.json and model.safetensors or its shards (HfCheckpoint,
  // the loader every model type shares). The weights keep the checkpoint's dtype.
  static std::shared_ptr<GPT> from_pretrained(const std::string& dir);
  // Loads HF-named, HF-laid-out weights into this model (strict: every weight present, nothing
  // unknown); `source` names the file or index in errors.
  void load_hf_weights(std::map<std::string, Tensor> tensors, const std::string& source);
  void load_hf_weights(const std::string& safetensors_path);  // one file
  // Writes config.json and model.safetensors (atomically) in HF's layout.
  void save_pretrained(const std::string& dir) const override;

  std::shared_ptr<GPTBody> transformer;

 private:
  GPTConfig config_;
};

}  // namespace mt::nn
