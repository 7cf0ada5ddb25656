// The GPT-2 transformer pieces: MLP, causal self-attention and the pre-norm block.
//
// Names follow Hugging Face's GPT2 modules (c_attn, c_proj, c_fc, ln_1, ln_2), so
// parameter paths and LoRA target names are the ones users know from PEFT. Unlike
// HF's Conv1D ([in, out]), every projection here is a Linear with weight [out, in];
// GPT::from_pretrained transposes when it loads HF weights.
//
//   x   // [B, T, C]   C = n_embd, H = n_head, D = C / H
//   Block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
//   attn:   q, k, v = split(c_attn(x), C)     // each [B, T, C] -> [B, H, T, D]
//           y = c_proj(causal_sdpa(q, k, v)) // scale 1/sqrt(D), dropout on the probabilities
//   mlp:    y = c_proj(gelu_tanh(c_fc(x)))   // hidden 4C unless n_inner says otherwise
// Dropout (attention probabilities, and each residual branch) is active only in training mode.
#pragma once

#include <cstdint>
#include <memory>

#include "core/random.h"
#include "ops/nn/layers.h"

namespace mt::nn {

struct TransformerShape {
  int64_t n_embd;   // C
  int64_t n_head;   // H; must divide C
  int64_t n_inner;  // MLP hidden width
  double dropout;   // attention probabilities and residual branches
  double layer_norm_epsilon;
};

class MLP : public Module {
 public:
  MLP(const TransformerShape& shape, Generator* generator);
  // dropout(c_proj(gelu_tanh(c_fc(x)))) [B, T, C] -> [B, T, C]: one mlp_gelu when c_fc and
  // c_proj are both plain Linears with biases, neither running in FP8 (Linear::runs_fp8);
  // otherwise c_proj's forward of hidden(x).
  Tensor forward(const Tensor& x) const;
  // gelu_tanh(c_fc(x)) [B, T, n_inner]: one linear_gelu when c_fc is a plain Linear with a
  // bias (on CUDA one GEMM, the GELU in its epilogue); otherwise (a LoRALinear in its place,
  // no bias, FP8) c_fc's own forward, then gelu.
  Tensor hidden(const Tensor& x) const;
  std::shared_ptr<Linear> c_fc;    // [n_inner, C]
  std::shared_ptr<Linear> c_proj;  // [C, n_inner]
  double dropout;
  // Off: never one mlp_gelu, always c_proj's forward of hidden(x) (GPT::set_fused_ops).
  bool fused = true;

 private:
  Tensor hidden_in_scope(const Tensor& x) const;  // hidden() inside a scope already open
};

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const TransformerShape& shape, Generator* generator);
  // [B, T, C] -> [B, T, C]. With a cache (keys/values [B, H, past, D] of the positions before
  // x's, undefined before the first step), x's keys and values are appended to it and x attends
  // to all of them; after the prompt a cache takes one token at a time.
  Tensor forward(const Tensor& x, Tensor* cached_k = nullptr, Tensor* cached_v = nullptr) const;
  std::shared_ptr<Linear> c_attn;  // [3C, C]: q, k, v stacked in that order
  std::shared_ptr<Linear> c_proj;  // [C, C]
  int64_t n_head;
  double dropout;
  // Selective recomputation: keep q, k, v and the output, recompute the attention core
  // (scores, softmax, dropout: the [B, H, T, T] tensors) in backward.
  bool recompute_attention = false;
};

class Block : public Module {
 public:
  Block(const TransformerShape& shape, Generator* generator);
  Tensor forward(const Tensor& x) const;  // [B, T, C] -> [B, T, C]
  // The block with its two residual adds left to the norms after them: the block's input is
  // x + pending (pending undefined: x alone), and its output is stream + delta, unadded, so that
  // the next norm (the next block's ln_1, or the final one) adds it in its own pass
  // (add_layer_norm). forward(x) is forward_residual(x, {}) with the last add done.
  struct Residual {
    Tensor stream;  // the residual stream after attention, [B, T, C]
    Tensor delta;   // the MLP's output, [B, T, C]
  };
  Residual forward_residual(const Tensor& x, const Tensor& pending, Tensor* cached_k = nullptr,
                            Tensor* cached_v = nullptr) const;
  // forward() with activation checkpointing (autograd/checkpoint.h): only x is kept
  // and the block is re-run in backward. When nothing in the MLP's output projection
  // trains (a frozen base without an adapter there), that projection, its dropout and
  // the last residual add stay outside the recomputed segment: their backward needs no
  // activation (only the weight), so backward re-runs ln_1 .. GELU and not that GEMM.
  Tensor forward_checkpointed(const Tensor& x) const;
  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<MLP> mlp;

 private:
  Residual residual_in_scope(const Tensor& x, const Tensor& pending, Tensor* cached_k = nullptr,
                             Tensor* cached_v = nullptr) const;
};

}  // namespace mt::nn
