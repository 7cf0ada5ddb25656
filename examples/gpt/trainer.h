// What the GPT examples share: device and precision flags, the training loop with its
// progress lines, evaluation, and text in and out through the byte tokenizer.
//
// The loop is the one a user writes with PyTorch AMP: forward and loss under autocast,
// the loss scaled (fp16 only), backward, unscale, clip, scaler step, scaler update, LR
// schedule. Nothing in a step reads the device back except the logged loss.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/data/token_dataset.h"
#include "core/data/token_file.h"
#include "core/format.h"
#include "distributed/process_group.h"
#include "ops/nn/gpt.h"

namespace gpt_example {

// --device and --amp, resolved: "auto" means cuda with bf16 when a GPU is visible, else cpu in f32.
// Under mpirun every rank trains its shard of each batch (DistributedDataParallel); rank 0
// alone prints and writes files. The GPU is the rank's local index.
struct Placement {
  mt::Device device = mt::kCPU;
  std::optional<mt::DType> amp;             // the autocast dtype; empty: f32 throughout
  mt::dist::ProcessGroup* group = nullptr;  // set when launched by mpirun
  bool is_main() const { return group == nullptr || group->is_main(); }
  int world_size() const { return group == nullptr ? 1 : group->world_size(); }
  std::string describe() const;
};

// Checks for numeric flags. CLI11's PositiveNumber and NonNegativeNumber print their bounds as
// "0.000000 to <a 309-digit number>" (and refuse 0 in a message that puts 0 in range); these
// say "--steps: expected a positive number, got -1".
CLI::Validator positive();
CLI::Validator non_negative();

struct PlacementFlags {
  std::string device = "auto";
  std::string amp = "auto";
  void add_to(CLI::App& app);
  Placement resolve() const;
};

struct TrainFlags {
  std::string data;      // training token file
  std::string val_data;  // optional validation token file
  int64_t steps = 300;
  int64_t batch_size = 16;
  int64_t seq_len = 64;
  double lr = 1e-3;
  int64_t warmup = 30;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping
  uint64_t seed = 1337;
  int64_t log_every = 25;
  int64_t eval_batches = 8;
  std::string checkpoint = "off";  // GPTCheckpointing::parse
  std::string save_dir;            // training checkpoints (empty: none)
  int64_t save_every = 0;          // steps between checkpoints (0: only when stopped by a signal)
  int64_t keep = 3;                // checkpoints kept
  bool resume = false;             // continue from the newest checkpoint in save_dir
  int64_t stop_at = 0;             // stop after this step as a signal would (0: never)
  bool detect_anomaly = false;     // name the first op whose output is NaN or inf (slow)
  bool deterministic = false;      // repeatable kernels only (mt::backends::set_deterministic_algorithms)
  bool cuda_graph = false;         // capture the step once and replay it (mt::CudaGraphStep)
  void add_to(CLI::App& app, const std::string& data_help);
};

struct TrainResult {
  bool interrupted = false;              // stopped by SIGTERM/SIGINT/SIGUSR1 after writing a checkpoint
  double first_loss = 0, last_loss = 0;  // training loss of the first and last logged steps
  std::optional<double> val_loss;        // after training, when validation data was given
  double seconds = 0;
};

// Trains `params` (the model's trainable parameters) on flags.data and prints progress lines.
TrainResult train(mt::nn::GPT& model, const std::vector<mt::Tensor>& params, const TrainFlags& flags,
                  const Placement& placement, const std::string& tag);

// Mean loss over the first `batches` windows of `file` (file order), in eval mode, no gradient.
double evaluate(mt::nn::GPT& model, const mt::data::TokenFile& file, int64_t batch_size, int64_t seq_len,
                int64_t batches, const Placement& placement);

// A sample continuation of `prompt`, decoded as text (bytes that are not printable are escaped).
std::string sample_text(const mt::nn::GPT& model, const std::string& prompt, int64_t new_tokens, double temperature,
                        int64_t top_k, uint64_t seed);

using mt::with_commas;  // "1,234,567"

// "c_attn,c_proj" -> {"c_attn", "c_proj"} (empty items dropped)
std::vector<std::string> split_commas(const std::string& text);

}  // namespace gpt_example
