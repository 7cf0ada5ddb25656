// The basic layers, initialised as torch.nn initialises them.
#pragma once

#include <cstdint>
#include <memory>

#include "core/random.h"
#include "ops/fp8/fp8_linear.h"
#include "ops/nn/module.h"
#include "ops/norm/norm.h"

namespace mt::nn {

class LinearOptions {
 public:
  LinearOptions(int64_t in_features, int64_t out_features) : in_(in_features), out_(out_features) {}
  LinearOptions& bias(bool b) {
    bias_ = b;
    return *this;
  }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool bias() const { return bias_; }

 private:
  int64_t in_, out_;
  bool bias_ = true;
};

// y = x W^T + b; W [out, in] and b [out] drawn from U(-1/sqrt(in), 1/sqrt(in))
// (kaiming_uniform with a = sqrt(5), PyTorch's default).
// Under Fp8AutocastGuard (ops/fp8/fp8_autocast.h) forward runs fp8_linear with the layer's FP8
// state, made at the first such forward; elsewhere, and when fp8_excluded is set, linear().
// A layer whose weight was stored in FP8 (quantize_weight_fp8: Note [FP8 frozen base],
// ops/fp8/fp8_rowwise.h) is frozen and runs fp8_rowwise_linear, with or without the guard.
class Linear : public Module {
 public:
  explicit Linear(const LinearOptions& options, Generator* generator = nullptr);
  // Wraps existing tensors, sharing their storage, as trainable parameters: weight
  // [out, in] and bias [out] or undefined. Layers that take over a Linear
  // (LoRALinear) and factors made in a given dtype and device start from here.
  // With weight_scale_inv ([out] f32), weight is an FP8 weight (f8e4m3, as quantize_weight_fp8
  // leaves it) and is registered frozen, the factors as the buffer "weight_scale_inv".
  Linear(const Tensor& weight, const Tensor& bias, const Tensor& weight_scale_inv = Tensor());
  virtual Tensor forward(const Tensor& x) const;  // [..., in] -> [..., out]
  // forward(x) for a checkpointed segment's recomputation that never reads the output
  // (mt::in_recomputation): the same op recorded, the same gradients, the output left unwritten
  // and the GEMM skipped (OutputValues::unread). FP8 layers compute it: FP8 autocast's refuse to
  // run in a segment, and an FP8 weight without an adapter has no gradient to record.
  virtual Tensor forward_unread(const Tensor& x) const;
  // Whether forward(x) runs in FP8: the weight is FP8, or FP8 autocast is on for x's device and the
  // layer is not excluded. Models that fuse a Linear's GEMM into a bigger op (MLP's mlp_gelu) ask
  // this first.
  bool runs_fp8(const Tensor& x) const;
  // Replaces the weight by its rows cast to E4M3 with one scale each (quantize_fp8_rows), where the
  // weight is: "weight" becomes the f8e4m3 [out, in] tensor (the same handle, frozen, its gradient
  // dropped) and the f32 buffer "weight_scale_inv" [out] appears beside it (kept f32 by to(DType)).
  // The high-precision weight's memory goes once nothing else holds it. Errors: a weight already
  // FP8, or sides that are not multiples of 16 (what FP8 GEMMs take).
  void quantize_weight_fp8();
  bool has_fp8_weight() const { return weight_scale_inv.defined(); }
  Tensor weight;            // [out, in]: f32/f16/bf16/f64, or f8e4m3 with weight_scale_inv
  Tensor bias;              // [out], undefined without bias
  Tensor weight_scale_inv;  // [out] f32: weight row i stands for weight[i] * weight_scale_inv[i]; else undefined
  // Kept out of FP8 autocast (an LM head: its logits feed the softmax, which FP8 would coarsen).
  bool fp8_excluded = false;
  // The FP8 scaling state (histories, scales, the weight cache); null until the first FP8 forward.
  // Not in state_dict(): training checkpoints save it through fp8_state_dict (ops/nn/fp8_state_dict.h).
  mutable std::shared_ptr<Fp8LinearState> fp8_state;
};

// Rows of a [num_embeddings, dim] table drawn from N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator* generator = nullptr);
  Tensor forward(const Tensor& ids) const;  // [...] ids -> [..., dim]
  Tensor weight;                            // [num_embeddings, dim]
};

// Normalises over the last dimension; weight ones, bias zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;
  // {x + delta, forward(x + delta)} in one pass (add_layer_norm): a residual add and this norm.
  AddNorm forward_add(const Tensor& x, const Tensor& delta) const;
  Tensor weight, bias;  // [dim]
  double eps;
  // Set by models whose norm output only feeds GEMMs, which autocast runs in the low
  // dtype anyway: under autocast the norm then writes that dtype itself (the same
  // values as an f32 output cast afterwards; one pass over the activations fewer in
  // forward and in backward). Off: the output has the input's dtype, as in PyTorch.
  bool output_in_autocast_dtype = false;
  // Off: forward_add is add() and then forward(), two ops (the same values for an f32 x; under
  // autocast a half x is added in its own dtype by add() but widened by add_layer_norm), so that a
  // benchmark can show what the fusion buys (GPT::set_fused_ops).
  bool fuse_add = true;

 private:
  Tensor normalize(const Tensor& x) const;  // forward() without its trace scope
};

// Zeroes elements with probability p while training; the identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p);
  Tensor forward(const Tensor& x) const;
  double p;
};

}  // namespace mt::nn
