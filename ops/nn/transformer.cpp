#include "ops/nn/transformer.h"

#include <typeinfo>

#include "autograd/checkpoint.h"
#include "ops/attention/attention.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/matmul/matmul.h"
#include "ops/shape/join.h"
#include "ops/shape/shape.h"

namespace mt::nn {

MLP::MLP(const TransformerShape& shape, Generator* generator) : dropout(shape.dropout) {
  register_module("c_fc", c_fc, std::make_shared<Linear>(LinearOptions(shape.n_embd, shape.n_inner), generator));
  register_module("c_proj", c_proj, std::make_shared<Linear>(LinearOptions(shape.n_inner, shape.n_embd), generator));
}

Tensor MLP::hidden(const Tensor& x) const {
  const auto scope = trace_scope();
  return hidden_in_scope(x);
}

Tensor MLP::hidden_in_scope(const Tensor& x) const {
  // Only a Linear itself: a subclass in c_fc's place (LoRALinear) computes its own forward, and
  // so does a Linear running in FP8 (fp8_linear, then the GELU).
  const Linear& fc = *c_fc;
  if (typeid(fc) == typeid(Linear) && fc.bias.defined() && !fc.runs_fp8(x)) return linear_gelu(x, fc.weight, fc.bias);
  return gelu(fc.forward(x), GeluApproximation::tanh);
}

Tensor MLP::forward(const Tensor& x) const {
  const auto scope = trace_scope();
  // Both layers plain Linears with biases: one mlp_gelu, whose backward forms the GELU's
  // derivative in the second layer's input-gradient GEMM. Otherwise (a LoRALinear or another
  // subclass in either place, a missing bias, a layer running in FP8) each layer's own forward.
  const Linear &fc = *c_fc, &proj = *c_proj;
  const bool plain =
      typeid(fc) == typeid(Linear) && typeid(proj) == typeid(Linear) && !fc.runs_fp8(x) && !proj.runs_fp8(x);
  const Tensor y = fused && plain && fc.bias.defined() && proj.bias.defined()
                       ? mlp_gelu(x, fc.weight, fc.bias, proj.weight, proj.bias)
                       : c_proj->forward(hidden_in_scope(x));
  return mt::dropout(y, dropout, is_training());
}

CausalSelfAttention::CausalSelfAttention(const TransformerShape& shape, Generator* generator)
    : n_head(shape.n_head), dropout(shape.dropout) {
  MT_CHECK(shape.n_head > 0 && shape.n_embd % shape.n_head == 0, "CausalSelfAttention: n_embd ", shape.n_embd,
           " is not a multiple of n_head ", shape.n_head);
  register_module("c_attn", c_attn, std::make_shared<Linear>(LinearOptions(shape.n_embd, 3 * shape.n_embd), generator));
  register_module("c_proj", c_proj, std::make_shared<Linear>(LinearOptions(shape.n_embd, shape.n_embd), generator));
}

Tensor CausalSelfAttention::forward(const Tensor& x, Tensor* cached_k, Tensor* cached_v) const {
  const auto scope = trace_scope();
  MT_CHECK_T(ShapeError, x.dim() == 3, "CausalSelfAttention: expected x [B, T, C], got ", shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / n_head;
  const std::vector<Tensor> qkv = split(c_attn->forward(x), C, /*dim=*/2);                       // 3 x [B, T, C]
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, n_head, D}), 1, 2); };  // [B, H, T, D]
  const double p = is_training() ? dropout : 0.0;
  std::vector<Tensor> q_k_v = {heads(qkv[0]), heads(qkv[1]), heads(qkv[2])};
  bool causal = true;
  if (cached_k != nullptr) {
    if (cached_k->defined()) {
      // A query block after cached keys would need a bottom-right causal mask; one query sees them all.
      MT_CHECK(T == 1, "CausalSelfAttention: after the prompt a KV cache takes one token at a time, got ", T);
      q_k_v[1] = cat({*cached_k, q_k_v[1]}, 2);
      q_k_v[2] = cat({*cached_v, q_k_v[2]}, 2);
      causal = false;
    }
    *cached_k = q_k_v[1];
    *cached_v = q_k_v[2];
  }
  auto attend = [p, causal](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], causal, p)};
  };
  const Tensor y = recompute_attention ? checkpoint(attend, q_k_v)[0] : attend(q_k_v)[0];  // [B, H, T, D]
  const Tensor merged = reshape(transpose(y, 1, 2), {B, T, C});
  return mt::dropout(c_proj->forward(merged), dropout, is_training());
}

Block::Block(const TransformerShape& shape, Generator* generator) {
  register_module("ln_1", ln_1, std::make_shared<LayerNorm>(shape.n_embd, shape.layer_norm_epsilon));
  register_module("attn", attn, std::make_shared<CausalSelfAttention>(shape, generator));
  register_module("ln_2", ln_2, std::make_shared<LayerNorm>(shape.n_embd, shape.layer_norm_epsilon));
  // Both norms feed only GEMMs (qkv and the MLP's input, with any LoRA adapters on them).
  ln_1->output_in_autocast_dtype = true;
  ln_2->output_in_autocast_dtype = true;
  register_module("mlp", mlp, std::make_shared<MLP>(shape, generator));
}

Tensor Block::forward(const Tensor& x) const {
  const auto scope = trace_scope();
  const Residual out = residual_in_scope(x, Tensor());
  return add(out.stream, out.delta);
}

Block::Residual Block::forward_residual(const Tensor& x, const Tensor& pending, Tensor* cached_k,
                                        Tensor* cached_v) const {
  const auto scope = trace_scope();
  return residual_in_scope(x, pending, cached_k, cached_v);
}

Block::Residual Block::residual_in_scope(const Tensor& x, const Tensor& pending, Tensor* cached_k,
                                         Tensor* cached_v) const {
  const AddNorm in = pending.defined() ? ln_1->forward_add(x, pending) : AddNorm{x, ln_1->forward(x)};
  const AddNorm mid = ln_2->forward_add(in.sum, attn->forward(in.normed, cached_k, cached_v));  // h = x + attn
  return {mid.sum, mlp->forward(mid.normed)};
}

Tensor Block::forward_checkpointed(const Tensor& x) const {
  const auto scope = trace_scope();
  bool projection_trains = false;
  for (const Tensor& p : mlp->c_proj->parameters()) projection_trains = projection_trains || p.requires_grad();
  // The segments hold the submodules themselves (not this block), so a recompute never reaches
  // a destroyed block.
  if (projection_trains) {
    return checkpoint(
        [ln_1 = ln_1, attn = attn, ln_2 = ln_2, mlp = mlp](const Tensor& t) {
          const Tensor h = add(t, attn->forward(ln_1->forward(t)));
          return add(h, mlp->forward(ln_2->forward(h)));
        },
        x);
  }
  // Segment: x -> (h, GELU(c_fc(ln_2(h)))); then h + dropout(c_proj(hidden)) outside it.
  const std::vector<Tensor> kept = checkpoint(
      [ln_1 = ln_1, attn = attn, ln_2 = ln_2, mlp = mlp](const std::vector<Tensor>& in) {
        const Tensor h = add(in[0], attn->forward(ln_1->forward(in[0])));
        return std::vector<Tensor>{h, mlp->hidden(ln_2->forward(h))};
      },
      {x});
  return add(kept[0], mt::dropout(mlp->c_proj->forward(kept[1]), mlp->dropout, mlp->is_training()));
}

}  // namespace mt::nn
