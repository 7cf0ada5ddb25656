// The FP8 states of a model's Linear layers (ops/fp8/fp8_linear.h), for training checkpoints.
// They are kept apart from Module::state_dict, which stays what it was for a model never run in
// FP8 (and for every model: weights load into FP8 and non-FP8 runs alike).
//
//   "<layer path>.recipe"                       i64 [4]: the recipe the state was made with
//   "<layer path>.<tensor>.amax_history"        delayed scaling only, tensor = input, weight,
//   "<layer path>.<tensor>.scale" / ".scale_inv"  grad_output (Fp8LinearState::state_dict)
//
// Only layers that have run in FP8 have entries. optim/training_checkpoint.h writes them under
// "fp8." and restores them, so a resumed FP8 run repeats the uninterrupted one bit for bit.
//
// Beside them: the states' health as a training loop reports it (fp8_health), and a guard under
// which forwards (an evaluation) run on copies of the states, leaving the run's own untouched.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/nn/layers.h"
#include "ops/nn/module.h"

namespace mt::nn {

// The states of every Linear in `module` (itself included) that has one; the states' own tensors.
std::map<std::string, Tensor> fp8_state_dict(const Module& module);

// Makes each Linear's state what `state` says: a new state (its recipe from the saved entry, on the
// layer's device) where it has entries, none where it has not (as the saved model had none there).
// Every key is checked before any layer changes; an entry for no Linear layer is an error.
void load_fp8_state_dict(Module& module, const std::map<std::string, Tensor>& state);

// The delayed-scaling states of a model's FP8 layers, summed up (current scaling keeps none).
struct Fp8Health {
  int64_t layers = 0;     // Linear layers with an FP8 state
  int64_t states = 0;     // their tensor states with a scale: x, W and dy, 3 a layer (current scaling: once cast)
  int64_t overflows = 0;  // Fp8TensorState::overflows summed: saturated casts since the states were made
  double min_scale = std::numeric_limits<double>::quiet_NaN();  // over the states' scales; NaN without states
  double max_scale = std::numeric_limits<double>::quiet_NaN();
};

// Reads every state of `module`'s Linear layers (itself included) in one copy to the host per
// device: it waits for the device, so call it where a sync happens anyway (a logged step).
Fp8Health fp8_health(const Module& module);

// For its lifetime, gives every Linear of `module` a copy of its FP8 state (no state where it has
// none), and puts the originals back when it ends: FP8 forwards under it move only the copies, so
// an evaluation leaves the training run's scales, histories, overflow counts and weight casts as
// they were. The originals keep their tensors (a captured CUDA Graph goes on updating them).
class Fp8StateRestoreGuard {
 public:
  explicit Fp8StateRestoreGuard(const Module& module);
  ~Fp8StateRestoreGuard();
  Fp8StateRestoreGuard(const Fp8StateRestoreGuard&) = delete;
  Fp8StateRestoreGuard& operator=(const Fp8StateRestoreGuard&) = delete;

 private:
  std::vector<std::pair<Linear*, std::shared_ptr<Fp8LinearState>>> originals_;
};

}  // namespace mt::nn
