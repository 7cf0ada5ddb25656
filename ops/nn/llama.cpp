#include "ops/nn/llama.h"

#include <filesystem>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "ops/attention/attention.h"
#include "ops/common.h"
#include "ops/loss/loss.h"
#include "ops/nn/hf_checkpoint.h"
#include "ops/nn/parameter_init.h"
#include "ops/ops.h"

namespace mt::nn {
namespace {

std::shared_ptr<Linear> projection(int64_t in, int64_t out, bool bias, Generator* generator) {
  return std::make_shared<Linear>(LinearOptions(in, out).bias(bias), generator);
}

// [B, T, H*D] -> [B, H, T, D]
Tensor heads(const Tensor& x, int64_t n, int64_t d) {
  return transpose(reshape(x, {x.size(0), x.size(1), n, d}), 1, 2);
}

// The layout of packed rows: their positions, and the mask keeping their sequences apart, made
// once for every layer as an additive bias in the dtype attention will run in (the autocast dtype,
// else the stream's).
TokenLayout packed_layout(const PackedSequences& packed, const Tensor& ids, const Tensor& stream) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"positions", packed.positions},
                                std::pair<const char*, const Tensor&>{"segments", packed.segments}}) {
    MT_CHECK_T(ShapeError, t.defined() && t.shape() == ids.shape() && t.dtype() == DType::i64, "Llama: packed ", name,
               " must be i64 of the ids' shape ", shape_str(ids.shape()), ", got ",
               t.defined() ? ops::describe(t) : std::string("none"));
    MT_CHECK(t.device() == ids.device(), "Llama: packed ", name, " must be on the ids' device ", ids.device().str(),
             ", got ", ops::describe(t));
  }
  const DeviceType device = stream.device().type;
  const DType dtype = autocast::is_enabled(device) ? autocast::dtype(device) : stream.dtype();
  return TokenLayout{0, packed.positions.contiguous(), attention_bias(document_mask(packed.segments), dtype)};
}

}  // namespace

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", init_constant({dim}, 1.0));
}

// Every RMSNorm of these models feeds only GEMMs (q/k/v, gate/up, the head): under autocast the
// norm writes the autocast dtype itself, the values of its f32 output cast once, instead of each
// projection casting the same f32 activation again.
Tensor RMSNorm::forward(const Tensor& x) const {
  const auto scope = trace_scope();
  const DeviceType device = x.device().type;
  if (autocast::is_enabled(device)) return rms_norm(x, weight, eps, autocast::dtype(device));
  return rms_norm(x, weight, eps);
}

AddNorm RMSNorm::forward_add(const Tensor& x, const Tensor& delta) const {
  const auto scope = trace_scope();
  const DeviceType device = x.device().type;
  if (autocast::is_enabled(device)) return add_rms_norm(x, delta, weight, eps, autocast::dtype(device));
  return add_rms_norm(x, delta, weight, eps);
}

LlamaAttention::LlamaAttention(const LlamaConfig& c, Generator* g)
    : n_head(c.num_attention_heads), n_kv_head(c.num_key_value_heads), head_dim(c.dim_per_head()) {
  register_module("q_proj", q_proj, projection(c.hidden_size, n_head * head_dim, c.attention_bias, g));
  register_module("k_proj", k_proj, projection(c.hidden_size, n_kv_head * head_dim, c.attention_bias, g));
  register_module("v_proj", v_proj, projection(c.hidden_size, n_kv_head * head_dim, c.attention_bias, g));
  register_module("o_proj", o_proj, projection(n_head * head_dim, c.hidden_size, c.o_proj_bias, g));
}

Tensor LlamaAttention::forward(const Tensor& x, const RotaryEmbedding& rope, const TokenLayout& layout,
                               Tensor* cached_k, Tensor* cached_v) const {
  const auto scope = trace_scope();
  const Tensor q = rope.apply(heads(q_proj->forward(x), n_head, head_dim), layout);
  Tensor k = rope.apply(heads(k_proj->forward(x), n_kv_head, head_dim), layout);
  Tensor v = heads(v_proj->forward(x), n_kv_head, head_dim);
  bool causal = true;
  if (cached_k != nullptr) {
    if (cached_k->defined()) {
      // Past keys come first; a query block after them would need a bottom-right causal mask,
      // which is why a cache takes one new token at a time once it holds any.
      MT_CHECK(x.size(1) == 1, "LlamaAttention: after the prompt a KV cache takes one token at a time, got ",
               x.size(1));
      k = cat({*cached_k, k}, 2);
      v = cat({*cached_v, v}, 2);
      causal = false;  // the one query sees every cached key
    }
    *cached_k = k;
    *cached_v = v;
  }
  // Grouped-query attention: the n_head / n_kv_head query heads of a group read one k and v head.
  const Tensor y = scaled_dot_product_attention(q, k, v, causal, 0.0, std::nullopt, layout.attn_mask);
  return o_proj->forward(reshape(transpose(y, 1, 2), {x.size(0), x.size(1), n_head * head_dim}));
}

LlamaMLP::LlamaMLP(const LlamaConfig& c, Generator* g) {
  register_module("gate_proj", gate_proj, projection(c.hidden_size, c.intermediate_size, false, g));
  register_module("up_proj", up_proj, projection(c.hidden_size, c.intermediate_size, false, g));
  register_module("down_proj", down_proj, projection(c.intermediate_size, c.hidden_size, false, g));
}

Tensor LlamaMLP::forward(const Tensor& x, OutputValues values) const {
  const auto scope = trace_scope();
  const Tensor h = swiglu(gate_proj->forward(x), up_proj->forward(x));
  return values == OutputValues::unread ? down_proj->forward_unread(h) : down_proj->forward(h);
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, Generator* g) {
  register_module("self_attn", self_attn, std::make_shared<LlamaAttention>(c, g));
  register_module("mlp", mlp, std::make_shared<LlamaMLP>(c, g));
  register_module("input_layernorm", input_layernorm, std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps));
  register_module("post_attention_layernorm", post_attention_layernorm,
                  std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps));
}

AddNorm LlamaDecoderLayer::forward(const Tensor& x, const Tensor& pending, const RotaryEmbedding& rope,
                                   const TokenLayout& layout, Tensor* cached_k, Tensor* cached_v,
                                   OutputValues mlp_output) const {
  const auto scope = trace_scope();
  const AddNorm in =
      pending.defined() ? input_layernorm->forward_add(x, pending) : AddNorm{x, input_layernorm->forward(x)};
  const AddNorm mid =
      post_attention_layernorm->forward_add(in.sum, self_attn->forward(in.normed, rope, layout, cached_k, cached_v));
  return {mid.sum, mlp->forward(mid.normed, mlp_output)};
}

LlamaModel::LlamaModel(const LlamaConfig& c, Generator* g)
    : config_(c), rotary_(std::make_shared<const RotaryEmbedding>(c.dim_per_head(), c.rope_theta, c.rope_scaling)) {
  register_module("embed_tokens", embed_tokens, std::make_shared<Embedding>(c.vocab_size, c.hidden_size, g));
  register_module("layers", layers_list, std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(layers_list->push_back(std::make_shared<LlamaDecoderLayer>(c, g)));
  }
  register_module("norm", norm, std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps));
}

Tensor LlamaModel::forward(const Tensor& ids, KVCache* cache, const PackedSequences* packed) const {
  const auto scope = trace_scope();
  MT_CHECK_T(ShapeError, ids.dim() == 2, "Llama: ids must be [B, T], got ", shape_str(ids.shape()));
  MT_CHECK(cache == nullptr || packed == nullptr, "Llama: packed sequences cannot run with a KV cache");
  const int64_t past = cache != nullptr ? cache->length : 0;
  const int64_t t = past + ids.size(1);
  MT_CHECK(t <= config_.max_position_embeddings, "Llama: a sequence of ", t, " tokens exceeds max_position_embeddings ",
           config_.max_position_embeddings);
  MT_CHECK(!config_.sliding_window || t <= *config_.sliding_window, "Llama: a sequence of ", t,
           " tokens is longer than the sliding_window ", config_.sliding_window.value_or(0), " of this ",
           config_.model_type, " model, and windowed attention is not implemented");
  if (cache != nullptr && cache->keys.empty()) {
    cache->keys.resize(layers.size());
    cache->values.resize(layers.size());
  }
  // Under checkpointing, activation memory is what limits: the norm and SwiGLU outputs the
  // projections keep for their gradients are rebuilt in backward instead (29% of a Llama-3-8B
  // layer's bytes, for three elementwise passes).
  const RebuildSavedGuard rebuild_saved(is_rebuild_saved_enabled() ||
                                        checkpointing.mode != GPTCheckpointing::Mode::off);
  AddNorm stream{embed_tokens->forward(ids), Tensor()};  // {residual stream, MLP output not yet added}
  const TokenLayout layout = packed != nullptr ? packed_layout(*packed, ids, stream.sum) : TokenLayout{past};
  for (size_t i = 0; i < layers.size(); ++i) {
    // The last layer is never recomputed: backward reaches it first and would rebuild at once
    // what keeping it holds (as GPT's blocks).
    const bool recompute =
        cache == nullptr && checkpointing.recomputes(static_cast<int64_t>(i), static_cast<int64_t>(layers.size()));
    if (recompute) {
      const Tensor x = stream.normed.defined() ? add(stream.sum, stream.normed) : stream.sum;
      // The segment holds the layer and the rotary table themselves, never this model.
      const std::vector<Tensor> out = mt::checkpoint(
          [layer = layers[i], rotary = rotary_, layout](const std::vector<Tensor>& in) {
            // Recomputed, the MLP output is only a root of the layer's backward: never written.
            const OutputValues mlp_output = mt::in_recomputation() ? OutputValues::unread : OutputValues::computed;
            const AddNorm o = layer->forward(in[0], Tensor(), *rotary, layout, nullptr, nullptr, mlp_output);
            return std::vector<Tensor>{o.sum, o.normed};
          },
          {x});
      stream = {out[0], out[1]};
    } else {
      stream = layers[i]->forward(stream.sum, stream.normed, *rotary_, layout, cache ? &cache->keys[i] : nullptr,
                                  cache ? &cache->values[i] : nullptr);
    }
  }
  if (cache != nullptr) cache->length = t;
  return stream.normed.defined() ? norm->forward_add(stream.sum, stream.normed).normed : norm->forward(stream.sum);
}

Llama::Llama(const LlamaConfig& config, Generator* generator) : config_(config) {
  config_.validate();
  register_module("model", model, std::make_shared<LlamaModel>(config_, generator));
  if (!config_.tie_word_embeddings) {
    register_module("lm_head", lm_head, projection(config_.hidden_size, config_.vocab_size, false, generator));
    lm_head->fp8_excluded = true;  // the head stays in bf16 under FP8 autocast
  }
  if (!parameter_init().random) return;  // to be loaded
  NoGradGuard no_grad;
  for (const auto& [name, p] : named_parameters()) {
    if (name.find("layernorm") != std::string::npos || name == "model.norm.weight") continue;  // ones
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else {
      p.copy_(init_normal(p.shape(), 0.02, generator));
    }
  }
}

void Llama::set_checkpointing(const std::string& mode) {
  const GPTCheckpointing parsed = GPTCheckpointing::parse(mode);
  MT_CHECK(parsed.mode != GPTCheckpointing::Mode::selective,
           "gradient checkpointing 'selective' is not implemented for ", config_.model_type,
           " models (off, blocks, blocks:K, layers:N)");
  model->checkpointing = parsed;
}

const Tensor& Llama::lm_head_weight() const { return lm_head ? lm_head->weight : model->embed_tokens->weight; }

Tensor Llama::forward(const Tensor& ids) const {
  const auto scope = trace_scope();
  return matmul(model->forward(ids), transpose(lm_head_weight(), 0, 1));
}

Tensor Llama::forward_cached(const Tensor& ids, KVCache& cache) const {
  const auto scope = trace_scope();
  return matmul(model->forward(ids, &cache), transpose(lm_head_weight(), 0, 1));
}

Tensor Llama::packed_loss(const Tensor& ids, const Tensor& targets, const PackedSequences& packed) const {
  return token_loss("Llama::packed_loss", ids, targets, &packed);
}

Tensor Llama::loss(const Tensor& ids, const Tensor& targets) const {
  return token_loss("Llama::loss", ids, targets, nullptr);
}

Tensor Llama::token_loss(const char* what, const Tensor& ids, const Tensor& targets,
                         const PackedSequences* packed) const {
  const auto scope = trace_scope();
  MT_CHECK_T(ShapeError, targets.shape() == ids.shape(), what, ": targets ", shape_str(targets.shape()),
             " must have the shape of ids ", shape_str(ids.shape()));
  const Tensor hidden = model->forward(ids, nullptr, packed);
  return linear_cross_entropy(reshape(hidden, {-1, config_.hidden_size}), lm_head_weight(), reshape(targets, {-1}));
}

std::shared_ptr<Llama> Llama::from_pretrained(const std::string& dir) {
  const LlamaConfig config = LlamaConfig::from_json_file(dir + "/config.json");
  HfCheckpoint checkpoint(dir);
  std::shared_ptr<Llama> model;
  {
    // Made in the checkpoint's dtype and left undrawn: the strict load below sets every value, and
    // an f32 model drawn first would cost a 7B checkpoint 28 GB of host memory and minutes.
    ParameterInitGuard empty_in_checkpoint_dtype(ParameterInit{TensorOptions(checkpoint.dtype()), false});
    model = std::make_shared<Llama>(config);
  }
  std::map<std::string, Tensor> state = checkpoint.tensors();
  if (config.tie_word_embeddings) state.erase("lm_head.weight");  // a tied copy some writers keep
  try {
    model->load_state_dict(state, /*strict=*/true);
  } catch (const Error& e) {
    detail::fail_file(checkpoint.description(), "not a checkpoint of this ", config.model_type,
                      " config (config.json): ", e.what());
  }
  return model;
}

void Llama::save_pretrained(const std::string& dir, int64_t max_shard_bytes) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) detail::fail_file(dir, "cannot create the directory: ", ec.message());
  save_hf_checkpoint(dir, state_dict(), max_shard_bytes);
  write_file_atomically(dir + "/config.json", "model config", config_.to_json());
}

}  // namespace mt::nn
