// Training checkpoints: everything a run needs to continue exactly where it stopped, in one
// safetensors file written atomically (core/atomic_file.h: temporary file, fsync, rename,
// directory fsync), so a crash at any moment leaves the previous checkpoint intact.
//
//   tensors   "model.<name>"       the module's state_dict (parameters and buffers)
//             "optim.<name>"       the optimizer's state_dict (moments, step counts, master weights)
//             "fp8.<name>"         the FP8 states of the model's Linear layers (ops/nn/fp8_state_dict.h),
//                                  for those that ran in FP8; none for a model that never did
//   metadata  "format"             "mixtrain-training-checkpoint-1"
//             "scaler.<key>"       GradScaler::state_dict      (decimal text)
//             "scheduler.<key>"    LRScheduler::state_dict
//             "rng.<device>"       "<seed> <offset>" of each default generator (cpu, cuda:N)
//             "extra.<key>"        the caller's numbers: step, data position, ...
// Doubles are written with 17 significant digits, so they read back bit for bit.
//
// CheckpointDirectory keeps "<dir>/step-<step>.safetensors", at most `keep` of them, and
// finds the newest one. Opening a directory removes the temporary files of writes that a crash
// interrupted: one trainer owns a checkpoint directory.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ops/nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace mt {

struct TrainingState {
  nn::Module* model = nullptr;          // required
  Optimizer* optimizer = nullptr;       // optional
  GradScaler* scaler = nullptr;         // optional
  LRScheduler* scheduler = nullptr;     // optional
  std::map<std::string, double> extra;  // written as is; filled in by load
};

void save_training_checkpoint(const std::string& path, const TrainingState& state);
// Checks the file's format and metadata first; then the model and the optimizer, each of which
// checks every name and shape before it copies anything; then the scaler, the scheduler and the
// default generators. FileError names the file and what does not match.
void load_training_checkpoint(const std::string& path, TrainingState& state);

class CheckpointDirectory {
 public:
  CheckpointDirectory(std::string dir, int64_t keep);
  // Writes step-<step>.safetensors, then deletes all but the newest `keep`. Returns the path.
  std::string save(int64_t step, const TrainingState& state);
  // Checkpoint files, oldest first (temporary files of interrupted writes are not listed).
  std::vector<std::string> list() const;
  std::optional<std::string> latest() const;

 private:
  std::string dir_;
  int64_t keep_;
};

}  // namespace mt
