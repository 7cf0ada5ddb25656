// The dependent-launch setting (core/cuda/dependent_launch.h): one process-wide flag saying
// whether the kernels written for programmatic dependent launch (the norms', ops/norm) are
// launched as dependents of the kernel before them, so that their blocks already wait on the GPU
// while that kernel drains. Where it is on and the device is sm_90 or later, besides: the norm
// backward's final sum reads the parameter gradients' partial rows while the backward writes them
// (ops/norm/norm_final_sum.cuh), the norm kernels ask the L2 for their first rows before they
// wait, and the allocator places what a graph capture allocates on its stream so that a dependent
// launch after it keeps its early start (core/cuda/context.cu). Where it is off, each of those
// kernels waits for the one before it to complete, as a <<<>>> launch does.
// Default: on. MT_DEPENDENT_LAUNCH=0 in the environment turns it off; any other value, or none,
// leaves it on. The variable is read once, at the first query or set_dependent_launch() call;
// set_dependent_launch() (or a DependentLaunchGuard) changes the setting at any time after.
// Kept in CPU-only builds too, so that code which sets and restores it reads back what it set.
#include <atomic>
#include <cstdlib>
#include <string>

#include "core/cuda/dependent_launch.h"

namespace mt::cuda {

namespace {
std::atomic<bool>& dependent_launch_setting() {
  static std::atomic<bool> on{[] {
    const char* text = std::getenv("MT_DEPENDENT_LAUNCH");
    return text == nullptr || std::string(text) != "0";
  }()};
  return on;
}
}  // namespace

void set_dependent_launch(bool on) { dependent_launch_setting().store(on); }

bool dependent_launch_requested() { return dependent_launch_setting().load(); }

}  // namespace mt::cuda
