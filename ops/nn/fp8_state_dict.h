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
#pragma once

#include <map>
#include <string>

#include "ops/nn/module.h"

namespace mt::nn {

// The states of every Linear in `module` (itself included) that has one; the states' own tensors.
std::map<std::string, Tensor> fp8_state_dict(const Module& module);

// Makes each Linear's state what `state` says: a new state (its recipe from the saved entry, on the
// layer's device) where it has entries, none where it has not (as the saved model had none there).
// Every key is checked before any layer changes; an entry for no Linear layer is an error.
void load_fp8_state_dict(Module& module, const std::map<std::string, Tensor>& state);

}  // namespace mt::nn
