// Host side of programmatic dependent launch (core/cuda/dependent_launch.cuh): whether the
// kernels written for it (the norms') are launched so. On unless MT_DEPENDENT_LAUNCH=0 is in the
// environment at start, or set_dependent_launch(false) (at any time; captures record the setting
// of their time). On an H200 it took op_bench layer_norm (bf16 [16384, 768], fwd+bwd, replayed
// from a CUDA Graph) from 71.5-71.7% to 75.2-75.3% of copy bandwidth, and the GPT-2 124M
// training step neither gained nor lost: 31.1 and 31.3 ms with it, 31.2 and 31.0 ms without,
// replayed from a graph; 31.0 and 31.2 ms eagerly either way (alternating runs in one call).
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
