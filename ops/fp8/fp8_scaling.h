// Per-tensor FP8 scaling recipes, as Transformer Engine's (transformer_engine/common/recipe):
//
//   delayed scaling   each tensor keeps a history of the amaxes its past casts saw; the scale for
//                     the next cast comes from that history, so the cast itself needs one pass
//                     over the data (its amax is reduced in the same pass, ops/fp8/fp8.h).
//   current scaling   the amax of the tensor about to be cast (fp8_amax, a pass of its own).
//
// Both set scale = (fp8_max / amax) / 2^margin, computed in f32 as scaled_max / amax with
// scaled_max = fp8_max * 2^-margin (exact: a power of two), and scale_inv = 1 / scale. When amax
// is 0, infinite or NaN there is no information in it: delayed scaling keeps the previous scale,
// current scaling uses 1. A positive amax so small that the quotient overflows gives FLT_MAX.
//
// A delayed-scaling state also counts its overflows: updates whose amax, times the scale the cast
// that measured it used, lay beyond what rounds to the format's largest value (fp8_max plus half
// its ulp: 464 for E4M3, 61440 for E5M2, a tie counted as rounded), so that the cast saturated.
// Products just above fp8_max are ordinary rounding, and common: scale = fp8_max / amax rounded in
// f32 gives amax * scale a little above fp8_max for about one amax in ten. Current scaling cannot
// overflow: its scale comes from the amax itself.
//
// Everything runs on the state's device (a small kernel on CUDA, a loop on the CPU): no value
// comes back to the host, so updates may be captured in a CUDA Graph.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace mt {

struct DelayedScaling {
  enum class Amax { max, most_recent };
  int history_len = 16;           // amaxes kept (Transformer Engine's default is 1024); >= 1
  Amax amax_compute = Amax::max;  // over the whole history, or the newest amax alone
  int margin = 0;                 // scale lowered by 2^margin: headroom for amaxes that grow
  DType format = DType::f8e4m3;   // f8e4m3 (forward) or f8e5m2 (gradients)
};

// One tensor's delayed-scaling state. Starts with an all-zero history and scale = scale_inv = 1.
struct Fp8TensorState {
  Fp8TensorState() = default;
  Fp8TensorState(const DelayedScaling& recipe, Device device);

  // Pushes new_amax (f32 with one element, on the state's device; typically
  // quantize_fp8(...).amax) into the history, then sets scale and scale_inv from the history:
  //   amax_history[0] = new_amax, amax_history[i] = the previous amax_history[i - 1] (the oldest
  //   falls off), amax = max over the history (NaN entries ignored, as fmaxf does) or new_amax
  //   (most_recent); scale as in the header comment, else the previous scale kept. Before that,
  //   overflows += 1 when new_amax * scale saturated (above), scale being the one new_amax's cast
  //   used (the state's own until this update: Note [FP8 scaling update points], fp8_linear.h).
  void update(const Tensor& new_amax);

  // "amax_history", "scale", "scale_inv" -> the state's tensors (as they are, not copies).
  std::map<std::string, Tensor> state_dict() const;
  // Copies the three tensors in (any device; converted to f32). Throws naming the key when one is
  // missing, unexpected, or of another shape (the history's length is the recipe's).
  void load_state_dict(const std::map<std::string, Tensor>& state);

  DelayedScaling recipe;
  Tensor amax_history;  // f32 [history_len]: [0] the newest
  Tensor scale;         // f32 [1]: multiplies x before the cast
  Tensor scale_inv;     // f32 [1]: 1 / scale, what the GEMM multiplies by
  // i64 [1]: the updates that found a saturated cast, since the state was made. Not in
  // state_dict(): a health figure of the run (nn::fp8_health), not something a resume repeats.
  Tensor overflows;
  // Current scaling keeps no state between casts; it leaves the latest cast's scale (f32 [1]) here,
  // for nn::fp8_health (outside CUDA Graph captures: a captured step's replays leave the one before).
  // Its casts cannot saturate (the scale is fp8_max over the tensor's own amax).
  Tensor last_scale;
};

struct Fp8Scale {
  Tensor scale;      // f32 [1]
  Tensor scale_inv;  // f32 [1]
};

// Current (just-in-time) scaling: the scale for a tensor whose amax is `amax` (f32 with one
// element, e.g. fp8_amax(x)), on amax's device; 1 when amax is 0, infinite or NaN.
Fp8Scale current_scale(const Tensor& amax, DType format, int margin = 0);

}  // namespace mt
