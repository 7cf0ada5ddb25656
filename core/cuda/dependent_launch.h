// Host side of programmatic dependent launch (core/cuda/dependent_launch.cuh): whether the
// kernels written for it (the norms', ops/norm) are launched as programmatic dependents of the
// kernel before them. One process-wide setting, on by default: MT_DEPENDENT_LAUNCH=0 in the
// environment turns it off (core/cuda/dependent_launch_setting.cpp says exactly how), and
// set_dependent_launch() sets it at any time (a captured graph keeps the setting of its capture).
// It takes effect only on sm_90 and later (dependent_launch_enabled). It speeds up the norm
// kernels themselves, while a whole GPT-2 training step neither gains nor loses measurably
// (docs/performance.md has the measurements).
#pragma once

namespace mt::cuda {

void set_dependent_launch(bool on);
bool dependent_launch_requested();
// Requested, and `device` is sm_90 or later (the first with griddepcontrol).
bool dependent_launch_enabled(int device);

// Sets the dependent launch on or off for a scope, then restores what it was:
//   { mt::cuda::DependentLaunchGuard plain(false);  step(); }
class DependentLaunchGuard {
 public:
  explicit DependentLaunchGuard(bool on) : previous_(dependent_launch_requested()) { set_dependent_launch(on); }
  ~DependentLaunchGuard() { set_dependent_launch(previous_); }
  DependentLaunchGuard(const DependentLaunchGuard&) = delete;
  DependentLaunchGuard& operator=(const DependentLaunchGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace mt::cuda
