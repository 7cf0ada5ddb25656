#include "ops/nn/gpt.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "core/atomic_file.h"
#include "core/safetensors.h"
#include "core/view.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/loss/loss.h"
#include "ops/matmul/matmul.h"
#include "ops/nn/hf_checkpoint.h"
#include "ops/nn/parameter_init.h"

namespace mt::nn {

namespace {

using json = nlohmann::json;

using detail::fail_file;

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF's Conv1D weights are [in, out]: the 2-D weights inside the blocks (c_attn, c_proj, c_fc).
bool is_conv1d_weight(const std::string& name) {
  return starts_with(name, "transformer.h.") && ends_with(name, ".weight") && name.find(".ln_") == std::string::npos;
}

// HF checkpoints name the body "transformer." (GPT2LMHeadModel) or nothing (GPT2Model).
std::string with_body_prefix(const std::string& name) {
  return starts_with(name, "transformer.") || name == "lm_head.weight" ? name : "transformer." + name;
}

// The causal-mask buffers older transformers versions saved; they hold no weights.
bool is_mask_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

TransformerShape block_shape(const GPTConfig& c) {
  return TransformerShape{c.n_embd, c.n_head, c.mlp_width(), c.dropout, c.layer_norm_epsilon};
}

}  // namespace

// ------------------------------------------------------------------ config

void GPTConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    MT_CHECK(v > 0, "GPTConfig: ", field, " must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("n_positions", n_positions);
  positive("n_embd", n_embd);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  MT_CHECK(n_embd % n_head == 0, "GPTConfig: n_embd ", n_embd, " is not a multiple of n_head ", n_head);
  MT_CHECK(n_inner >= 0, "GPTConfig: n_inner must be 0 (meaning 4 * n_embd) or positive, got ", n_inner);
  MT_CHECK(dropout >= 0 && dropout < 1, "GPTConfig: dropout must lie in [0, 1), got ", dropout);
  MT_CHECK(layer_norm_epsilon > 0, "GPTConfig: layer_norm_epsilon must be positive, got ", layer_norm_epsilon);
}

GPTConfig GPTConfig::from_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_file(path, "cannot open the GPT-2 config: ", std::strerror(errno));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail_file(path, "the GPT-2 config is not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail_file(path, "the GPT-2 config must be a JSON object");
  GPTConfig c;
  try {
    if (j.contains("model_type") && j["model_type"] != "gpt2") {
      fail_file(path, "model_type is ", j["model_type"].dump(), ", expected \"gpt2\"");
    }
    c.vocab_size = j.value("vocab_size", c.vocab_size);
    c.n_positions = j.value("n_positions", c.n_positions);
    c.n_embd = j.value("n_embd", c.n_embd);
    c.n_layer = j.value("n_layer", c.n_layer);
    c.n_head = j.value("n_head", c.n_head);
    if (j.contains("n_inner") && !j["n_inner"].is_null()) c.n_inner = j["n_inner"].get<int64_t>();
    c.layer_norm_epsilon = j.value("layer_norm_epsilon", c.layer_norm_epsilon);
    const double resid = j.value("resid_pdrop", 0.1), embd = j.value("embd_pdrop", 0.1),
                 attn = j.value("attn_pdrop", 0.1);
    if (resid != embd || resid != attn) {
      fail_file(path, "resid_pdrop ", resid, ", embd_pdrop ", embd, " and attn_pdrop ", attn,
                " differ; mixtrain's GPT has one dropout rate");
    }
    c.dropout = resid;
    const std::string act = j.value("activation_function", std::string("gelu_new"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
      fail_file(path, "activation_function \"", act, "\" is not supported (gelu_new or gelu_pytorch_tanh)");
    }
    if (!j.value("scale_attn_weights", true) || j.value("scale_attn_by_inverse_layer_idx", false) ||
        j.value("reorder_and_upcast_attn", false) || !j.value("tie_word_embeddings", true)) {
      fail_file(path,
                "unsupported GPT-2 option: mixtrain's GPT needs scale_attn_weights true, "
                "scale_attn_by_inverse_layer_idx false, reorder_and_upcast_attn false, tie_word_embeddings true");
    }
  } catch (const json::exception& e) {
    fail_file(path, "a GPT-2 config field has the wrong type: ", e.what());
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail_file(path, e.what());
  }
  return c;
}

std::string GPTConfig::to_json() const {
  const json j = {{"architectures", {"GPT2LMHeadModel"}},
                  {"model_type", "gpt2"},
                  {"vocab_size", vocab_size},
                  {"n_positions", n_positions},
                  {"n_ctx", n_positions},
                  {"n_embd", n_embd},
                  {"n_layer", n_layer},
                  {"n_head", n_head},
                  {"n_inner", n_inner > 0 ? json(n_inner) : json(nullptr)},
                  {"activation_function", "gelu_new"},
                  {"resid_pdrop", dropout},
                  {"embd_pdrop", dropout},
                  {"attn_pdrop", dropout},
                  {"layer_norm_epsilon", layer_norm_epsilon},
                  {"initializer_range", 0.02},
                  {"scale_attn_weights", true},
                  {"tie_word_embeddings", true},
                  {"use_cache", true}};
  return j.dump(2) + "\n";
}

// ------------------------------------------------------------------ checkpointing

GPTCheckpointing GPTCheckpointing::parse(const std::string& text) {
  GPTCheckpointing c;
  if (text == "off" || text == "none") return c;
  if (text == "selective") {
    c.mode = Mode::selective;
    return c;
  }
  // The N of "prefix:N" when text is that and N >= minimum.
  auto number_after = [&text](const std::string& prefix, int64_t minimum, int64_t* n) {
    if (text.size() <= prefix.size() || text.compare(0, prefix.size(), prefix) != 0) return false;
    try {
      size_t used = 0;
      *n = std::stoll(text.substr(prefix.size()), &used);
      return used == text.size() - prefix.size() && *n >= minimum;
    } catch (const std::exception&) {
      return false;
    }
  };
  if (text == "blocks") {
    c.mode = Mode::blocks;
    return c;
  }
  if (number_after("blocks:", 1, &c.every)) {
    c.mode = Mode::blocks;
    return c;
  }
  if (number_after("layers:", 0, &c.count)) {
    c.mode = Mode::layers;
    return c;
  }
  throw Error("checkpointing: '" + text +
              "' is not one of off, blocks, blocks:K (every K-th block, K >= 1), layers:N (N blocks) or selective");
}

bool GPTCheckpointing::recomputes(int64_t block, int64_t n_blocks) const {
  const int64_t candidates = n_blocks > 1 ? n_blocks - 1 : n_blocks;  // all but the last of several
  if (block >= candidates) return false;
  if (mode == Mode::blocks) return block % every == 0;
  if (mode != Mode::layers) return false;
  // count of the candidates, evenly: block i when floor((i + 1) N / M) passes an integer.
  const int64_t n = std::min(count, candidates);
  return (block + 1) * n / candidates > block * n / candidates;
}

int64_t GPTCheckpointing::recomputed(int64_t n_blocks) const {
  int64_t total = 0;
  for (int64_t i = 0; i < n_blocks; ++i) total += recomputes(i, n_blocks) ? 1 : 0;
  return total;
}

std::string GPTCheckpointing::str() const {
  switch (mode) {
    case Mode::off:
      return "off";
    case Mode::selective:
      return "selective";
    case Mode::blocks:
      return every == 1 ? "blocks" : "blocks:" + std::to_string(every);
    case Mode::layers:
      return "layers:" + std::to_string(count);
  }
  return "?";
}

// ------------------------------------------------------------------ model

GPTBody::GPTBody(const GPTConfig& config, Generator* generator) : dropout(config.dropout) {
  register_module("wte", wte, std::make_shared<Embedding>(config.vocab_size, config.n_embd, generator));
  register_module("wpe", wpe, std::make_shared<Embedding>(config.n_positions, config.n_embd, generator));
  register_module("h", h, std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    blocks.push_back(h->push_back(std::make_shared<Block>(block_shape(config), generator)));
  }
  register_module("ln_f", ln_f, std::make_shared<LayerNorm>(config.n_embd, config.layer_norm_epsilon));
  ln_f->output_in_autocast_dtype = true;  // feeds only the tied head's GEMM
}

Tensor GPTBody::forward(const Tensor& ids, KVCache* cache) const {
  const auto scope = trace_scope();
  MT_CHECK_T(ShapeError, ids.dim() == 2, "GPT: expected ids [B, T], got ", shape_str(ids.shape()));
  const int64_t past = cache != nullptr ? cache->length : 0, T = ids.size(1);
  MT_CHECK_T(ShapeError, T >= 1 && past + T <= wpe->weight.size(0), "GPT: sequence length ", past + T,
             " is outside [1, n_positions = ", wpe->weight.size(0), "]");
  if (cache != nullptr && cache->keys.empty()) {
    cache->keys.resize(blocks.size());
    cache->values.resize(blocks.size());
  }
  const Tensor positions = arange(static_cast<double>(past), static_cast<double>(past + T), 1.0,
                                  TensorOptions(DType::i64).device(ids.device()));  // [T]
  Tensor x = add(wte->forward(ids), wpe->forward(positions));                       // [B, T, C]
  x = mt::dropout(x, dropout, is_training());
  // Each block's last residual add is left to the norm after it (Block::forward_residual):
  // the residual stream is read and written once per norm, not also once per add.
  Tensor pending;
  for (size_t i = 0; i < blocks.size(); ++i) {
    // The last block is never recomputed: backward reaches it first, right after the
    // head, and would rebuild at once the activations that keeping them holds. Keeping
    // them raises the peak by at most the head's working memory (one chunk of logits),
    // and saves one block's forward. A cached (generation) forward records nothing to recompute.
    const bool recompute =
        cache == nullptr && checkpointing.recomputes(static_cast<int64_t>(i), static_cast<int64_t>(blocks.size()));
    if (recompute) {
      if (pending.defined()) x = add(x, pending);
      pending = Tensor();
      x = blocks[i]->forward_checkpointed(x);
    } else {
      const Block::Residual out = blocks[i]->forward_residual(x, pending, cache ? &cache->keys[i] : nullptr,
                                                              cache ? &cache->values[i] : nullptr);
      x = out.stream;
      pending = out.delta;
    }
  }
  if (cache != nullptr) cache->length = past + T;
  return pending.defined() ? ln_f->forward_add(x, pending).normed : ln_f->forward(x);
}

GPT::GPT(const GPTConfig& config, Generator* generator) : config_(config) {
  config_.validate();
  register_module("transformer", transformer, std::make_shared<GPTBody>(config_, generator));
  if (!parameter_init().random) return;  // to be loaded
  NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (const auto& [name, p] : named_parameters()) {
    if (name.find(".ln_") != std::string::npos) continue;  // ln_1, ln_2, ln_f keep (1, 0)
    if (ends_with(name, ".bias")) {
      p.zero_();
      continue;
    }
    const bool residual = ends_with(name, ".c_proj.weight");
    p.copy_(init_normal(p.shape(), residual ? residual_std : 0.02, generator));
  }
}

void GPT::set_checkpointing(const GPTCheckpointing& checkpointing) {
  MT_CHECK(checkpointing.every >= 1, "GPT::set_checkpointing: every must be >= 1, got ", checkpointing.every);
  transformer->checkpointing = checkpointing;
  for (const auto& block : transformer->blocks) {
    block->attn->recompute_attention = checkpointing.mode == GPTCheckpointing::Mode::selective;
  }
}

void GPT::set_fused_ops(bool on) {
  for (const auto& block : transformer->blocks) {
    block->ln_1->fuse_add = block->ln_2->fuse_add = on;
    block->mlp->fused = on;
  }
  transformer->ln_f->fuse_add = on;
}

Tensor GPT::forward(const Tensor& ids) const {
  const auto scope = trace_scope();
  return linear(transformer->forward(ids), transformer->wte->weight);  // tied LM head: [B, T, V]
}

Tensor GPT::forward_cached(const Tensor& ids, KVCache& cache) const {
  const auto scope = trace_scope();
  return linear(transformer->forward(ids, &cache), transformer->wte->weight);
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets) const {
  const auto scope = trace_scope();
  MT_CHECK_T(ShapeError, targets.shape() == ids.shape(), "GPT::loss: targets ", shape_str(targets.shape()),
             " must have the shape of ids ", shape_str(ids.shape()));
  // The tied head and the loss fused: the [B*T, V] logits exist one chunk at a time.
  const Tensor hidden = transformer->forward(ids);  // [B, T, C]
  LinearCrossEntropyOptions options;
  options.chunk_rows = head_chunk_rows;
  return linear_cross_entropy(hidden.reshape({-1, config_.n_embd}), transformer->wte->weight, targets.reshape({-1}),
                              options);
}

// ------------------------------------------------------------------ Hugging Face files

std::shared_ptr<GPT> GPT::from_pretrained(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  const GPTConfig config = GPTConfig::from_json_file(config_path);
  std::shared_ptr<GPT> model;
  try {
    model = std::make_shared<GPT>(config);
  } catch (const OutOfMemoryError& e) {
    // A mistyped size in config.json, not a model that fits: name the file and the sizes.
    fail_file(config_path, "the model it describes (vocab_size ", config.vocab_size, ", n_positions ",
              config.n_positions, ", n_embd ", config.n_embd, ", n_layer ", config.n_layer,
              ") does not fit in memory: ", e.what());
  }
  const HfCheckpoint checkpoint(dir);
  model->to(checkpoint.dtype());
  model->load_hf_weights(checkpoint.tensors(), checkpoint.description());
  return model;
}

void GPT::load_hf_weights(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  load_hf_weights(std::move(file.tensors), path);
}

void GPT::load_hf_weights(std::map<std::string, Tensor> tensors, const std::string& path) {
  std::map<std::string, Tensor> state;  // our names, HF's layout for now
  for (auto& [hf_name, t] : tensors) {
    const std::string name = with_body_prefix(hf_name);
    if (!is_mask_buffer(name)) state[name] = std::move(t);
  }
  // GPT-2 checkpoints store the projections as Conv1D [in, out]; a converter may have written
  // Linear's [out, in]. The first qkv weight ([C, 3C] or [3C, C]) tells which; square weights cannot.
  const auto qkv = state.find("transformer.h.0.attn.c_attn.weight");
  const bool conv1d_layout = qkv == state.end() || qkv->second.dim() != 2 || qkv->second.size(1) == 3 * config_.n_embd;
  if (conv1d_layout) {
    for (auto& [name, t] : state) {
      if (is_conv1d_weight(name) && t.dim() == 2) t = raw::contiguous(t.transpose(0, 1));
    }
  }
  // A tied checkpoint may still carry lm_head.weight; it must be the embedding itself.
  if (auto it = state.find("lm_head.weight"); it != state.end()) {
    const auto wte = state.find("transformer.wte.weight");
    const bool tied = wte != state.end() && wte->second.shape() == it->second.shape() &&
                      wte->second.dtype() == it->second.dtype() &&
                      std::equal(static_cast<const char*>(wte->second.data_ptr()),
                                 static_cast<const char*>(wte->second.data_ptr()) + wte->second.nbytes(),
                                 static_cast<const char*>(it->second.data_ptr()));
    if (!tied) fail_file(path, "lm_head.weight differs from wte.weight; mixtrain's GPT ties them");
    state.erase(it);
  }
  try {
    load_state_dict(state, /*strict=*/true);
  } catch (const Error& e) {
    fail_file(path, "not a GPT-2 checkpoint for this config: ", e.what());
  }
}

void GPT::save_pretrained(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail_file(dir, "cannot create the directory: ", ec.message());
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : state_dict()) state[name] = is_conv1d_weight(name) ? t.transpose(0, 1) : t;
  save_safetensors(dir + "/model.safetensors", state, {{"format", "pt"}});
  write_file_atomically(dir + "/config.json", "GPT-2 config", config_.to_json());
}

}  // namespace mt::nn
