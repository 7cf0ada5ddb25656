// FP8 autocast: inside an Fp8AutocastGuard, nn::Linear layers run their three GEMMs in FP8
// (fp8_linear, ops/fp8/fp8_linear.h) and every other op follows the ordinary autocast policy,
// so the guard goes inside a bf16 AutocastGuard, as Transformer Engine's fp8_autocast goes
// inside torch.autocast:
//
//   { mt::AutocastGuard amp(mt::DeviceType::cuda, mt::DType::bf16);
//     mt::Fp8AutocastGuard fp8(mt::DeviceType::cuda, mt::Fp8Recipe::delayed());
//     loss = model.loss(x, y); }
//   loss.backward();
//
// The state is thread-local and per device type, like autocast's; guards nest, and
// enabled = false opens a sub-region where Linear layers run as they would without it. Outside
// every guard nothing changes: Linear::forward asks fp8_autocast_enabled() first and takes its
// usual path when it is false. Layers with Linear::fp8_excluded set (the LM heads) stay out.
#pragma once

#include <string>

#include "core/device.h"
#include "ops/fp8/fp8_scaling.h"

namespace mt {

// How an FP8 layer scales its tensors (ops/fp8/fp8_scaling.h). The formats are Transformer
// Engine's "hybrid" ones, fixed per tensor: E4M3 for activations and weights, E5M2 for gradients.
struct Fp8Recipe {
  enum class Scaling { delayed, current };
  Scaling scaling = Scaling::delayed;
  int history_len = 16;                                           // delayed: amaxes kept (TE's default 1024)
  DelayedScaling::Amax amax_compute = DelayedScaling::Amax::max;  // delayed: over the history or the newest
  int margin = 0;                                                 // both: scale = fp8_max / amax / 2^margin

  static Fp8Recipe delayed(int history_len = 16, DelayedScaling::Amax amax_compute = DelayedScaling::Amax::max,
                           int margin = 0);
  static Fp8Recipe current(int margin = 0);

  void validate() const;  // throws naming the field: history_len >= 1, |margin| <= 64
  // The per-tensor recipe of Fp8TensorState for one of the formats.
  DelayedScaling for_format(DType format) const;
  std::string str() const;  // "delayed scaling (history 16, amax max, margin 0)", "current scaling (margin 0)"
  bool operator==(const Fp8Recipe& other) const;
  bool operator!=(const Fp8Recipe& other) const { return !(*this == other); }
};

class Fp8AutocastGuard {
 public:
  Fp8AutocastGuard(DeviceType device_type, const Fp8Recipe& recipe = Fp8Recipe(), bool enabled = true);
  ~Fp8AutocastGuard();
  Fp8AutocastGuard(const Fp8AutocastGuard&) = delete;
  Fp8AutocastGuard& operator=(const Fp8AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool previous_enabled_;
  Fp8Recipe previous_recipe_;
};

// Whether the innermost Fp8AutocastGuard for this device type (on this thread) is enabled.
bool fp8_autocast_enabled(DeviceType device_type);
// Its recipe (the default recipe outside every guard).
const Fp8Recipe& fp8_autocast_recipe(DeviceType device_type);

}  // namespace mt
