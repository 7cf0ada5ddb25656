// Learning-rate schedules (torch.optim.lr_scheduler). A scheduler wraps an
// optimizer, remembers each group's base learning rate (the group's lr when the
// scheduler is made) and, like PyTorch, sets the lr for step 0 at once; every
// step() then advances one step and rewrites every group's lr:
//
//   mt::AdamW opt(params, mt::AdamWOptions(3e-4));
//   mt::WarmupCosineLR sched(opt, /*warmup_steps=*/100, /*total_steps=*/10000, /*min_lr_ratio=*/0.1);
//   for (...) { loss.backward(); opt.step(); opt.zero_grad(); sched.step(); }
//
// Every schedule here is a multiplier of the base lr, lr_g(step) = base_g * factor(step),
// computed in closed form (no drift from repeated multiplication). A scheduler
// owns the groups' lr: a value set by hand is overwritten at the next step().
// One scheduler per optimizer; the number of groups must not change under it.
// The schedule lives on the host: lr is a kernel argument of the optimizers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace mt {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step and sets every group's lr for it.
  void step();
  int64_t last_step() const { return last_step_; }
  // The lr set by the last step (or by the constructor) for group `group`.
  double last_lr(size_t group = 0) const;
  const std::vector<double>& last_lrs() const { return last_lrs_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The multiplier of the base lr at `step` (>= 0).
  virtual double factor(int64_t step) const = 0;

  // Checkpoint state: {"last_step": n}. Loading sets the lrs for that step; the
  // base lrs come from the optimizer the scheduler was made with.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Sets every group's lr for last_step_; derived constructors call it last.
  void apply();

 private:
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lrs_;
  int64_t last_step_ = 0;
};

// lr = base * factor for step < total_iters, then base (torch's ConstantLR).
// The defaults keep the base lr throughout.
class ConstantLR : public LRScheduler {
 public:
  explicit ConstantLR(Optimizer& optimizer, double factor = 1.0, int64_t total_iters = 0);
  double factor(int64_t step) const override;

 private:
  double factor_;
  int64_t total_iters_;
};

// Linear warmup from 0 to base over warmup_steps, then a half cosine from base to
// base * min_lr_ratio at total_steps, then constant (HF transformers'
// get_cosine_schedule_with_warmup with a floor):
//   s < W:       factor = s / W
//   W <= s < N:  factor = r + (1 - r) * (1 + cos(pi * (s - W) / (N - W))) / 2
//   s >= N:      factor = r
// Step 0 has lr 0 when W > 0, as in HF (the first optimizer step does not move). With
// WarmupStart::above_zero the warm-up is s < W: factor = (s + 1) / (W + 1) instead, so that no
// step is wasted at lr 0 and the rise stays strictly increasing into the cosine (the Trainer's).
enum class WarmupStart { at_zero, above_zero };

class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr_ratio = 0.0,
                 WarmupStart start = WarmupStart::at_zero);
  double factor(int64_t step) const override;

 private:
  int64_t warmup_steps_, total_steps_;
  double min_lr_ratio_;
  WarmupStart start_;
};

// lr = base * gamma^(step / step_size) (integer division; torch's StepLR).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double factor(int64_t step) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

}  // namespace mt
