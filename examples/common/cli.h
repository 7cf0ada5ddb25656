// The command-line convention of the programs in examples/ and tools/bench/: every flag they
// share is defined here once, so that it means the same thing, with the same default, in each.
//
//   --device auto|cpu|cuda|cuda:N  auto (default): the first GPU when one is usable, else the CPU.
//                                  Under mpirun, auto and cuda mean the GPU of the rank's local index.
//   --amp auto|off|bf16|fp16       auto (default): bf16 on a GPU, off (f32) on the CPU; fp16 scales
//                                  the loss (GradScaler).
//   --seed N                       1337 by default.
//   --save-dir DIR                 training checkpoints; SIGTERM, SIGINT or SIGUSR1 then finish the
//                                  step, write one and exit 0 (Note [Stopping on a signal]).
//   --save-every N                 steps between checkpoints (0, the default: only after the last
//                                  step and when stopped).
//   --keep N                       checkpoints kept in --save-dir (3).
//   --stop-at N                    stop after step N as a signal would (0, the default: never).
//   --resume                       continue from the newest checkpoint in --save-dir.
//
// A bad argument is reported before anything runs, as "<program>: --flag: expected ..., got ...";
// an error after that as "<program>: <message>" with exit status 2. Progress lines are
// "<program>: step N/M | ... | eta 1m05s", on a line-buffered stdout (setup()), so that they
// keep their order with stderr when both go to one file.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "distributed/process_group.h"
#include "optim/training_checkpoint.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace example {

// Call first in main: makes stdout line-buffered, and CLI11's errors name the program
// ("mt_train: --steps: expected a positive number, got 0").
void setup(CLI::App& app, const std::string& program);

// Checks for numeric and word flags, worded for a person: CLI11's own say
// "Value 2 not in range 0.000000 to 0.990000" or print 309-digit bounds. With the flag's name
// in front, CLI11 reports e.g. "--steps: expected a positive number, got -1".
CLI::Validator positive();                                        // > 0
CLI::Validator non_negative();                                    // >= 0
CLI::Validator range(double low, double high);                    // "expected a number from 0 to 0.99, got 2"
CLI::Validator above_zero_up_to(double high);                     // "expected a number above 0, at most 1, got 0"
CLI::Validator one_of(std::initializer_list<const char*> words);  // "expected auto, off, bf16 or fp16, got fp8"

constexpr uint64_t kDefaultSeed = 1337;
CLI::Option* add_seed(CLI::App& app, uint64_t& seed, const std::string& what);  // what: "initialisation and data"

// --device and --amp, resolved. Under mpirun every rank trains its shard of each batch
// (DistributedDataParallel); rank 0 alone prints and writes files.
struct Placement {
  mt::Device device = mt::kCPU;
  std::optional<mt::DType> amp;             // the autocast dtype; empty: f32 throughout
  mt::dist::ProcessGroup* group = nullptr;  // set when launched by mpirun
  bool is_main() const { return group == nullptr || group->is_main(); }
  int world_size() const { return group == nullptr ? 1 : group->world_size(); }
  int rank() const { return group == nullptr ? 0 : group->rank(); }
  std::string describe() const;  // "cuda:0, bf16 autocast, data parallel over 2 ranks"
};

// `--device` as given, resolved; the chosen GPU becomes the current one. A GPU asked for and not
// usable is a mt::DeviceError in one sentence: "--device cuda: no usable CUDA device (driver not found)".
mt::Device resolve_device(const std::string& device, const mt::dist::ProcessGroup* group);
// `--amp` as given, on `device`: the autocast dtype, or empty for f32.
std::optional<mt::DType> resolve_amp(const std::string& amp, const mt::Device& device);

enum class AmpFlag { with, without };

struct PlacementFlags {
  std::string device = "auto";
  std::string amp = "auto";
  void add_to(CLI::App& app, AmpFlag amp_flag = AmpFlag::with);
  // Joins the mpirun job when launched by one, then resolves --device and --amp.
  Placement resolve() const;
};

// Training checkpoints: --save-dir, --save-every, --keep, --stop-at, --resume.
struct CheckpointFlags {
  std::string save_dir;    // empty: no checkpoints
  int64_t save_every = 0;  // steps between checkpoints (0: only after the last step and when stopped)
  int64_t keep = 3;        // checkpoints kept
  int64_t stop_at = 0;     // stop after this step as a signal would (0: never)
  bool resume = false;     // continue from the newest checkpoint in save_dir
  void add_to(CLI::App& app);
  // Checks the flags together (--resume and --stop-at need --save-dir), then, with --save-dir,
  // opens the directory and installs the stop handlers (Note [Stopping on a signal]).
  std::optional<mt::CheckpointDirectory> open() const;
  void apply_to(mt::train::TrainerOptions& options) const;  // for programs that train through the Trainer
  // Whether to write a checkpoint after `step` of `steps` (the run not stopped).
  bool due(int64_t step, int64_t steps) const { return (save_every > 0 && step % save_every == 0) || step == steps; }
};

// Note [Stopping on a signal] (train/stop_signal.h): with --save-dir, the first SIGTERM, SIGINT
// or SIGUSR1 finishes the step, writes a checkpoint and exits 0. Returns why the run stops after
// `step` ("--stop-at", "SIGTERM", ...) or empty; a collective under mpirun.
std::string stop_reason(int64_t step, const CheckpointFlags& flags, mt::dist::ProcessGroup* group);

// Progress lines: train/progress.h's.
using mt::train::duration_text;
using mt::train::progress_line;
// The loss scale as it is ("65536", "0.25", "0.00012207"), "off" without loss scaling.
std::string loss_scale_text(std::optional<double> scale);
// printf into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace example
