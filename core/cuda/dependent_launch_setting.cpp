// The dependent-launch setting (core/cuda/dependent_launch.h), kept in CPU-only builds too, so
// that code which sets and restores it (DependentLaunchGuard) reads back what it set there.
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
