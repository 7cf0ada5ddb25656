#include "optim/lr_scheduler.h"

#include <cmath>

#include "core/error.h"

namespace mt {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (const ParamGroup& g : optimizer.param_groups()) base_lrs_.push_back(g.lr);
}

void LRScheduler::apply() {
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  MT_CHECK(groups.size() == base_lrs_.size(), "LRScheduler: the optimizer has ", groups.size(),
           " parameter groups but had ", base_lrs_.size(), " when the scheduler was made");
  const double f = factor(last_step_);
  last_lrs_.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].lr = base_lrs_[i] * f;
    last_lrs_[i] = groups[i].lr;
  }
}

void LRScheduler::step() {
  ++last_step_;
  apply();
}

double LRScheduler::last_lr(size_t group) const {
  MT_CHECK(group < last_lrs_.size(), "LRScheduler::last_lr: group ", group, " out of range (", last_lrs_.size(),
           " groups)");
  return last_lrs_[group];
}

std::map<std::string, double> LRScheduler::state_dict() const {
  return {{"last_step", static_cast<double>(last_step_)}};
}

void LRScheduler::load_state_dict(const std::map<std::string, double>& state) {
  const auto it = state.find("last_step");
  MT_CHECK(it != state.end(), "LRScheduler::load_state_dict: missing 'last_step'");
  const double s = it->second;
  MT_CHECK(s >= 0 && std::floor(s) == s && s < 9.0e15,
           "LRScheduler::load_state_dict: last_step must be a non-negative integer, got ", s);
  last_step_ = static_cast<int64_t>(s);
  apply();
}

// ---- ConstantLR ----

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer), factor_(factor), total_iters_(total_iters) {
  MT_CHECK(factor >= 0 && factor <= 1, "ConstantLR: factor must be in [0, 1], got ", factor);
  MT_CHECK(total_iters >= 0, "ConstantLR: total_iters must be >= 0, got ", total_iters);
  apply();
}

double ConstantLR::factor(int64_t step) const { return step < total_iters_ ? factor_ : 1.0; }

// ---- WarmupCosineLR ----

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr_ratio,
                               WarmupStart start)
    : LRScheduler(optimizer),
      warmup_steps_(warmup_steps),
      total_steps_(total_steps),
      min_lr_ratio_(min_lr_ratio),
      start_(start) {
  MT_CHECK(warmup_steps >= 0, "WarmupCosineLR: warmup_steps must be >= 0, got ", warmup_steps);
  MT_CHECK(total_steps > 0, "WarmupCosineLR: total_steps must be > 0, got ", total_steps);
  MT_CHECK(warmup_steps <= total_steps, "WarmupCosineLR: warmup_steps (", warmup_steps,
           ") must not exceed total_steps (", total_steps, ")");
  MT_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1, "WarmupCosineLR: min_lr_ratio must be in [0, 1], got ",
           min_lr_ratio);
  apply();
}

double WarmupCosineLR::factor(int64_t step) const {
  if (step < warmup_steps_) {
    if (start_ == WarmupStart::above_zero) {
      return static_cast<double>(step + 1) / static_cast<double>(warmup_steps_ + 1);
    }
    return static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  if (step >= total_steps_) return min_lr_ratio_;
  const double kPi = 3.14159265358979323846;
  const double progress = static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ratio_ + (1.0 - min_lr_ratio_) * 0.5 * (1.0 + std::cos(kPi * progress));
}

// ---- StepLR ----

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  MT_CHECK(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
  MT_CHECK(gamma > 0 && std::isfinite(gamma), "StepLR: gamma must be positive and finite, got ", gamma);
  apply();
}

double StepLR::factor(int64_t step) const { return std::pow(gamma_, static_cast<double>(step / step_size_)); }

}  // namespace mt
