// Dynamic loss scaling (torch.amp.GradScaler):
//
//   auto loss = mt::cross_entropy(model(x), y);
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);              // optional: before clip_grad_norm_
//   scaler.step(opt);                  // skipped when a gradient is inf/NaN
//   scaler.update();
//
// Note [Loss scaling and skipped steps]
// The scale, the growth tracker and the found-inf flag live on the device, so a
// step costs no host sync: unscale_ multiplies every gradient by 1/scale in one
// kernel per tensor and raises found_inf; step() passes the flag to the
// optimizer (fused optimizers skip on the device); update() halves the scale on
// inf (backoff) and doubles it after `growth_interval` clean steps in a row.
// Two guards against a silently dying run (apex issue 318: a scale collapsed to
// 1e-294): update() throws when the scale would fall below `min_scale` or after
// `max_consecutive_skips` skipped steps in a row. On CUDA those two checks read
// the device state every `check_interval` updates (one small sync), on the CPU
// at every update. bf16 needs no scaler but works with one.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mt {

class GradScalerOptions {
 public:
  GradScalerOptions() = default;
  GradScalerOptions& init_scale(double s) {
    init_scale_ = s;
    return *this;
  }
  GradScalerOptions& growth_factor(double g) {
    growth_factor_ = g;
    return *this;
  }
  GradScalerOptions& backoff_factor(double b) {
    backoff_factor_ = b;
    return *this;
  }
  GradScalerOptions& growth_interval(int64_t i) {
    growth_interval_ = i;
    return *this;
  }
  GradScalerOptions& min_scale(double s) {
    min_scale_ = s;
    return *this;
  }
  GradScalerOptions& max_consecutive_skips(int64_t n) {
    max_consecutive_skips_ = n;
    return *this;
  }
  GradScalerOptions& check_interval(int64_t n) {
    check_interval_ = n;
    return *this;
  }
  GradScalerOptions& enabled(bool e) {
    enabled_ = e;
    return *this;
  }
  double init_scale() const { return init_scale_; }
  double growth_factor() const { return growth_factor_; }
  double backoff_factor() const { return backoff_factor_; }
  int64_t growth_interval() const { return growth_interval_; }
  double min_scale() const { return min_scale_; }
  int64_t max_consecutive_skips() const { return max_consecutive_skips_; }
  int64_t check_interval() const { return check_interval_; }
  bool enabled() const { return enabled_; }

 private:
  double init_scale_ = 65536.0;
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  int64_t growth_interval_ = 2000;
  double min_scale_ = 1.0 / 65536.0;
  int64_t max_consecutive_skips_ = 100;
  int64_t check_interval_ = 100;
  bool enabled_ = true;
};

class GradScaler {
 public:
  explicit GradScaler(Device device, GradScalerOptions options = {});

  Tensor scale(const Tensor& loss);  // loss * scale (differentiable)
  void unscale_(Optimizer& optimizer);
  void step(Optimizer& optimizer);
  void update();

  double get_scale() const;  // waits for the device
  int64_t consecutive_skips() const;
  // Throws when too many steps in a row were skipped or the scale fell below min_scale
  // (waits for the device). update() calls it every check_interval updates; a step replayed
  // from a CUDA Graph runs no host code, so call it between replays now and then.
  void check_limits();
  // State for checkpoints: scale, growth tracker, consecutive skips (host values).
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  struct PerOptimizer {
    Tensor found_inf;  // f32 [1] on the device
    bool unscaled = false;
    bool stepped = false;
  };
  PerOptimizer& state_for(Optimizer& optimizer);

  Device device_;
  GradScalerOptions options_;
  Tensor scale_;              // f32 [1]
  Tensor growth_tracker_;     // i32 [1]
  Tensor consecutive_skips_;  // i32 [1]
  std::map<Optimizer*, PerOptimizer> per_optimizer_;
  int64_t updates_ = 0;
};

}  // namespace mt
