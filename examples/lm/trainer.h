// What the language-model programs (mt_train, mt_lora, mt_generate, ...) share, for any
// mt::nn::CausalLM: the training flags, turned into mt::train::TrainerOptions, the training run
// through mt::train::Trainer, and text in and out through the run's tokenizer. The flags every
// program shares (--device, --amp, --seed, the checkpoint flags) are examples/common/cli.h's.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/format.h"
#include "core/random.h"
#include "examples/common/cli.h"
#include "ops/nn/causal_lm.h"
#include "ops/nn/gpt.h"
#include "tokenizers/tokenizer.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace lm_example {

struct TrainFlags {
  std::string data;      // training token file
  std::string val_data;  // optional validation token file
  int64_t steps = 300;
  int64_t batch_size = 16;
  int64_t seq_len = 64;
  int64_t grad_accum = 1;
  double lr = 1e-3;
  int64_t warmup = 30;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;
  bool no_embedding_decay = false;
  double grad_clip = 1.0;  // 0: no clipping
  uint64_t seed = example::kDefaultSeed;
  int64_t log_every = 25;
  int64_t eval_every = 0;
  int64_t eval_batches = 8;
  std::string progress = "auto";
  std::string metrics;             // JSON-lines file
  std::string tensorboard;         // event-file directory
  double peak_tflops = 0;          // 0: from the GPU's name
  std::string checkpoint = "off";  // GPTCheckpointing::parse
  example::CheckpointFlags checkpoints;
  bool report = false;
  bool nvtx = false;
  std::string trace;            // host trace of the NVTX ranges (Chrome JSON)
  bool detect_anomaly = false;  // name the first op whose output is NaN or inf (slow)
  bool deterministic = false;   // repeatable kernels only (mt::backends::set_deterministic_algorithms)
  bool cuda_graph = false;      // capture the step once and replay it (mt::CudaGraphStep)
  // amp: every GEMM in the --amp dtype; fp8: the Linear layers in FP8 inside bf16 autocast
  // (TrainerOptions::fp8), the LM head and everything else in bf16.
  std::string precision = "amp";
  std::string fp8_recipe = "current";  // current or delayed (mt::Fp8Recipe; docs/numerics.md says why current)
  int64_t fp8_history = 16;            // delayed scaling: amaxes kept per tensor
  int64_t fp8_margin = 0;              // scale = fp8_max / amax / 2^margin
  // A device-memory budget ("22GiB"): the checkpointing mode becomes the one with the fewest
  // recomputed layers whose planned peak fits it (mt::train::plan_checkpointing; Llama family).
  std::string max_memory;
  bool dry_run = false;  // print the planned peak memory and stop before loading any weights
  // How batches are cut from the token file: "stream" (windows of --seq-len + 1 tokens, examples
  // may share one and see each other), "packed" (whole fine-tuning examples, several per row, each
  // with its own positions and attention; mt::data::PackedBatcher) or "padded" (the same examples
  // one per row, padded).
  std::string examples = "stream";
  void add_to(CLI::App& app, const std::string& data_help);
};

struct TrainResult {
  bool interrupted = false;              // stopped by a signal or --stop-at after writing a checkpoint
  double first_loss = 0, last_loss = 0;  // training loss of the first and last logged steps
  std::optional<double> val_loss;        // after training, when validation data was given
  double seconds = 0;
};

// What the memory plan needs besides the flags: LoRA's rank and targets (rank 0: full training)
// and the frozen base's dtype (f32, bf16 or fp8).
struct MemorySetup {
  int64_t lora_r = 0;
  std::vector<std::string> lora_targets;
  std::string base_dtype = "bf16";
};

// The memory estimate of a training step of a Llama-family model under `flags`: the plan for
// --max-memory, else the estimate for --checkpoint.
mt::train::MemoryEstimate plan_memory(const mt::nn::LlamaConfig& config, const TrainFlags& flags,
                                      const MemorySetup& setup);
// plan_memory for the model config.json describes, before any weight is loaded. A GPT-2 config is
// a FileError naming the flags (the plan knows the Llama family's layers only).
mt::train::MemoryEstimate plan_memory(const std::string& config_json_path, const TrainFlags& flags,
                                      const MemorySetup& setup);
// --dry-run: prints that plan as "<tag>: ... planned peak ...".
void print_memory_plan(const std::string& tag, const std::string& config_json_path, const TrainFlags& flags,
                       const MemorySetup& setup);

// Trains `model` (any CausalLM: GPT-2 or the Llama family; its trainable parameters) on flags.data through
// mt::train::Trainer. With --max-memory, `memory` describes the run for the plan.
TrainResult train(mt::nn::CausalLM& model, const TrainFlags& flags, const example::Placement& placement,
                  const std::string& tag, const MemorySetup& memory = {});

// Mean loss per target over the first --eval-batches batches of `path` (a token file or shards, in
// order, cut as --examples says), in eval mode, no gradient; targets outside a loss mask do not count.
double evaluate(mt::nn::CausalLM& model, const std::string& path, const TrainFlags& flags,
                const example::Placement& placement);

// The tokenizer of a run: `flag` (--tokenizer) when given, else the one saved in `model_dir` when
// it holds tokenizer files, else the byte tokenizer.
std::unique_ptr<mt::tok::Tokenizer> tokenizer_for(const std::string& flag, const std::string& model_dir);
// The directory whose tokenizer files describe `flag`'s tokenizer ("" for the byte tokenizer).
std::string tokenizer_directory(const std::string& flag);

// A model of the type `config_path` (a Hugging Face config.json) names, randomly initialised from
// `generator`: GPT-2 for "gpt2" (or no model_type), Llama for "llama", "mistral" and "qwen2".
// Any other type is a FileError naming the config.
std::shared_ptr<mt::nn::CausalLM> model_from_config(const std::string& config_path, mt::Generator* generator);

// How to draw a continuation: mt::nn::GenerateOptions' knobs and the sampling seed.
struct SampleOptions {
  int64_t new_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  double top_p = 1.0;        // nucleus; 1: off
  std::optional<int64_t> stop_token;
  bool use_cache = true;
  uint64_t seed = example::kDefaultSeed;
};

struct SampleResult {
  std::string text;           // the prompt and its continuation, as printable text (see sample)
  int64_t prompt_tokens = 0;  // the prompt's ids, special tokens included
  int64_t new_tokens = 0;     // drawn, the stop token included; fewer than asked when it came
  double seconds = 0;         // drawing them (the prompt's forward pass included)
};

// The text of a growing list of token ids, given out piece by piece as ids are added: each piece
// printable (control characters other than newline and tab escaped as "\x1b"), special tokens
// skipped, and never ending inside a UTF-8 character while more ids may come (Note [Streaming
// decoded text] in trainer.cpp).
class TextStream {
 public:
  explicit TextStream(const mt::tok::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Adds `ids` and returns the text they complete ("" while a character is unfinished). Ids the
  // tokenizer does not have are skipped: a model may have more rows than its tokenizer has ids.
  std::string add(const std::vector<int64_t>& ids);
  std::string finish();                              // the text held back, as it is
  const std::string& text() const { return text_; }  // the pieces so far, together

 private:
  std::string give_out(bool all);
  const mt::tok::Tokenizer& tokenizer_;
  std::vector<mt::tok::TokenId> ids_;
  size_t shown_ = 0;  // bytes of the decoded text given out
  std::string text_;
};

// A continuation of `prompt`, as text (TextStream's). With `on_text`, the text is also given
// piece by piece as it is drawn: first the prompt's, then what each token adds.
SampleResult sample(const mt::nn::CausalLM& model, const mt::tok::Tokenizer& tokenizer, const std::string& prompt,
                    const SampleOptions& options, const std::function<void(const std::string&)>& on_text = {});
// sample(...).text
std::string sample_text(const mt::nn::CausalLM& model, const mt::tok::Tokenizer& tokenizer, const std::string& prompt,
                        const SampleOptions& options);

using mt::with_commas;  // "1,234,567"

// "c_attn,c_proj" -> {"c_attn", "c_proj"} (empty items dropped)
std::vector<std::string> split_commas(const std::string& text);

}  // namespace lm_example
