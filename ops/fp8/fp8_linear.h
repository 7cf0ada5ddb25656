// fp8_linear: y = x W^T + b with the three GEMMs of a linear layer in FP8 (Transformer Engine's
// recipe: E4M3 for x and W, E5M2 for the output gradient dy, per-tensor scales, f32 accumulation).
// nn::Linear calls it under Fp8AutocastGuard (ops/fp8/fp8_autocast.h); it may be called directly.
//
//   forward  y  [M, N] = fp8_gemm(q(x) [M, K],    q(W) [N, K])   + bias (rounded to bf16)
//   dgrad    dx [M, K] = fp8_gemm(q(dy) [M, N],   q(W^T) [K, N])
//   wgrad    dW [N, K] = fp8_gemm(q(dy^T) [N, M], q(x^T) [K, M])
//   db       [N]       = the row sums of dy in f32 (from dy itself, not its FP8 cast)
// Every GEMM is fp8_gemm's a b^T form; the transposed operands come from quantize_fp8's
// transposed layout, in the same pass as the tensor's own cast (Fp8Layout::both; no transpose
// pass), and only for the gradients wanted: q(x^T) when W needs one, q(W^T) when x does. The backward keeps
// q(x^T) (1 byte an element) instead of x. dx comes in x's dtype (bf16 or f32 straight from the
// GEMM), dW in the weight's (f32 for master weights, straight from the GEMM, as linear's),
// db in f32. y has the autocast dtype when autocast is on for x's device, else the inputs'
// promoted dtype (f16 and f64 outputs are written from f32).
//
// Shapes. M (the leading dims of x, flattened: tokens) may be anything: when it is not a multiple
// of 16, x and dy are padded with zero rows to the next one inside the op (zeros change no amax
// and no sum) and the padding is cut from y and dx. Padding keeps a layer's numerics the same
// whatever the batch (a last short batch, one token at a time) for one copy of x and of dy. N and
// K (the weight's shape) that are not multiples of 16 fall back to linear() for every call (the
// bf16 path under autocast), with a warning printed once per weight shape: padding a weight
// would cost a padded copy of it and of its gradient at every step, for models whose widths are
// rarely that odd.
//
// Note [FP8 scaling update points]
// Delayed scaling (Fp8Recipe::delayed) casts each tensor with its state's current scale (from the
// amaxes of earlier casts only), and pushes the amax that cast measured into the state right after
// it (Fp8TensorState::update): x's state once per forward, dy's once per backward (when a
// gradient of x or W is wanted), W's once per cast of the weight, which happens once per
// optimizer step (below). Transformer Engine updates its forward scales when fp8_autocast exits
// and its backward scales at the end of backward; for a layer that casts each tensor once per
// forward and backward, as here, the scales each cast uses are the same. Current scaling
// (Fp8Recipe::current) takes each tensor's amax in a pass before its cast and keeps no history.
// A fresh state has scale 1, as in Transformer Engine: the first step casts unscaled.
//
// Note [FP8 weight cache]
// q(W) (and q(W^T), cast when a backward first needs it) is cached in the state, keyed by the
// weight's identity, storage and version as autocast's cast cache is (autograd/autocast.h): the
// micro-batches of one optimizer step reuse it, and the step's in-place update (a new version)
// makes the next forward cast again. A Module::to() (new storage) or load_state_dict (new
// version) does too. Resuming from a checkpoint taken between optimizer steps therefore repeats
// the uninterrupted run: both cast the weights at the next forward. A CUDA Graph capture neither
// reads nor fills the cache, so each replay casts the weight as it is at that replay (and, under
// delayed scaling, moves the weight's state at each replay's forward).
//
// Gradient checkpointing: fp8_linear refuses to run inside an mt::checkpoint segment (its
// recomputation would cast with scales the first pass has already moved on); checkpoint the
// attention core alone (GPT's "selective") or exclude the segment with Fp8AutocastGuard(..., false).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "ops/fp8/fp8_autocast.h"
#include "ops/fp8/fp8_scaling.h"

namespace mt {

// Note [FP8 weight cache]: the weight as the GEMMs read it, while it is unchanged.
struct Fp8WeightCache {
  std::weak_ptr<TensorImpl> source;  // the weight: identity, storage and version
  std::weak_ptr<Storage> storage;
  uint64_t version = 0;
  Tensor q;           // [N, K] f8e4m3
  Tensor q_t;         // [K, N] f8e4m3, or undefined until a backward needs it
  Tensor scale;       // f32 [1]: what q was cast with (copies: delayed scaling moves the state's on)
  Tensor scale_inv;   // f32 [1]
  int64_t casts = 0;  // times the weight was cast (as_is): one per optimizer step in training
};

// One linear layer's FP8 state, on the layer's device (nn::Linear owns one, made at its first
// FP8 forward). Under delayed scaling, `input` (x, E4M3), `weight` (W, E4M3) and `grad_output`
// (dy, E5M2) hold the histories and scales; under current scaling they stay default-constructed.
struct Fp8LinearState {
  Fp8LinearState(const Fp8Recipe& recipe, Device device);

  Fp8Recipe recipe;
  Device device;
  Fp8TensorState input, weight, grad_output;
  Fp8WeightCache weight_cache;

  // "recipe" (i64 [4] on the CPU: scaling, history_len, amax_compute, margin; what load needs to
  // make a state) and, under delayed scaling, "<tensor>.amax_history", "<tensor>.scale" and
  // "<tensor>.scale_inv" for tensor = input, weight, grad_output: the state's own tensors, not
  // copies. The weight cache is not saved (Note [FP8 weight cache]).
  std::map<std::string, Tensor> state_dict() const;
  // Copies a state_dict in (any device). Throws naming the key when one is missing or unexpected,
  // and naming both recipes when the saved one differs. Drops the weight cache.
  void load_state_dict(const std::map<std::string, Tensor>& state);
  // The recipe a state_dict was saved with (its "recipe" entry).
  static Fp8Recipe saved_recipe(const std::map<std::string, Tensor>& state);
};

// y [..., N] = x [..., K] W [N, K]^T + b [N] (b may be undefined), in FP8 as above. The state must
// be on x's device; the backward keeps it (dy's scaling happens there).
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const std::shared_ptr<Fp8LinearState>& state);

}  // namespace mt
