// Grad mode: whether ops record the graph. Thread-local, on by default.
//   { mt::NoGradGuard no_grad; ... }   // nothing inside is recorded
#pragma once

namespace mt {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : previous_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Sets grad mode to `enabled` for a scope (used by checkpointing's recompute).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(is_grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Saved-tensor rebuilding: while on, a tensor that an op saves for its backward, and that the op
// which produced it can make again from what that op saves anyway (SwiGLU's output, from gate
// and up), is saved as that recipe (autograd::SavedTensor): its memory goes when the forward
// drops it, and the saving op's backward rebuilds it, the same values bit for bit, at the cost of
// the producer's forward again (one elementwise pass). Thread-local, off by default; a checkpoint
// segment's recomputation runs under the state its forward ran in. Models turn it on where
// activation memory is what limits them (Llama under gradient checkpointing).
bool is_rebuild_saved_enabled();
void set_rebuild_saved_enabled(bool enabled);

class RebuildSavedGuard {
 public:
  explicit RebuildSavedGuard(bool enabled) : previous_(is_rebuild_saved_enabled()) {
    set_rebuild_saved_enabled(enabled);
  }
  ~RebuildSavedGuard() { set_rebuild_saved_enabled(previous_); }
  RebuildSavedGuard(const RebuildSavedGuard&) = delete;
  RebuildSavedGuard& operator=(const RebuildSavedGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace mt
