#include "examples/lm/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string_view>

#include <filesystem>

#include "core/data/token_corpus.h"
#include "core/data/token_dataset.h"
#include "core/nvtx.h"
#include "ops/nn/llama.h"
#include "ops/ops.h"
#include "train/data_source.h"
#include "train/throughput.h"

namespace lm_example {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ------------------------------------------------------------------ flags

void TrainFlags::add_to(CLI::App& app, const std::string& data_help) {
  app.add_option("--data", data, data_help)->required()->check(CLI::ExistingFile);
  app.add_option("--val-data", val_data, "validation token file (loss every --eval-every steps and after the last)")
      ->check(CLI::ExistingFile);
  app.add_option("--steps", steps, "optimizer steps")->capture_default_str()->check(example::positive());
  app.add_option("--batch-size", batch_size, "sequences per step")->capture_default_str()->check(example::positive());
  app.add_option("--seq-len", seq_len, "tokens per sequence")->capture_default_str()->check(example::positive());
  app.add_option("--grad-accum", grad_accum,
                 "micro-batches of --batch-size per optimizer step (the loss averaged over all their tokens)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--lr", lr, "peak learning rate (AdamW)")->capture_default_str()->check(example::positive());
  app.add_option("--warmup", warmup, "linear warm-up steps (from lr/(warmup+1)), then cosine decay")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--min-lr-ratio", min_lr_ratio, "final lr as a fraction of the peak")
      ->capture_default_str()
      ->check(example::range(0.0, 1.0));
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay (matrices only: not biases, norm gains)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_flag("--no-embedding-decay", no_embedding_decay, "no weight decay on the embedding tables either");
  app.add_option("--grad-clip", grad_clip, "clip the global gradient norm to this (0: off)")
      ->capture_default_str()
      ->check(example::non_negative());
  example::add_seed(app, seed, "initialisation, batches, dropout and the sample");
  app.add_option("--log-every", log_every, "steps between progress lines and metrics records")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--eval-every", eval_every, "steps between validations (0: after the last step only)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--examples", examples,
                 "stream: windows of --seq-len + 1 tokens cut from the token file; packed: whole fine-tuning "
                 "examples packed several per row, each with its own positions and attention (Llama family); "
                 "padded: the same examples one per row (packed and padded need a file mt_tokenize wrote from "
                 "--format prompt-completion or messages)")
      ->capture_default_str()
      ->check(example::one_of({"stream", "packed", "padded"}));
  app.add_option("--progress", progress, "auto (a bar on a terminal, lines elsewhere), bar or lines")
      ->capture_default_str()
      ->check(example::one_of({"auto", "bar", "lines"}));
  app.add_option("--metrics", metrics, "write the logged scalars to this JSON-lines file (rank 0)");
  app.add_option("--tensorboard", tensorboard, "write TensorBoard event files to this directory (rank 0)");
  app.add_option("--peak-tflops", peak_tflops, "the GPU's peak dense TFLOP/s for MFU (0: from its name)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_flag("--report", report, "profile a few steps and print where the time and the memory went, at the end");
  app.add_flag("--nvtx", nvtx, "NVTX ranges for Nsight Systems: step, forward, backward, optimizer, modules");
  app.add_option("--trace", trace, "record the NVTX ranges' host times to this Chrome-trace JSON file");
  CLI::Option* checkpoint_option = app.add_option("--checkpoint", checkpoint,
                                                  "gradient checkpointing: off, blocks (every block), blocks:K (every "
                                                  "K-th), layers:N (N blocks), or selective "
                                                  "(recompute attention only)")
                                       ->capture_default_str();
  app.add_option("--max-memory", max_memory,
                 "device-memory budget, e.g. 22GiB: the checkpointing that recomputes the fewest layers and whose "
                 "planned peak fits it (Llama family; the plan is printed)")
      ->excludes(checkpoint_option);
  app.add_flag("--dry-run", dry_run,
               "print the planned peak memory of a step (weights, optimizer state, activations) for this model, "
               "batch and sequence length, and stop without loading or allocating anything");
  checkpoints.add_to(app);
  app.add_flag("--detect-anomaly", detect_anomaly,
               "stop at the first op (forward or backward) whose output holds NaN or inf, naming it (slow)");
  app.add_flag("--cuda-graph", cuda_graph,
               "capture the training step in a CUDA Graph after two steps and replay it (one GPU, dropout 0)");
  app.add_flag("--deterministic", deterministic,
               "repeatable kernels only, so that a resumed GPU run repeats an uninterrupted one bit for bit");
  app.add_option("--eval-batches", eval_batches, "validation batches")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--precision", precision,
                 "amp (every GEMM in the --amp dtype) or fp8 (the Linear layers in FP8 inside bf16 autocast, which "
                 "needs --amp bf16; the LM head in bf16)")
      ->capture_default_str()
      ->check(example::one_of({"amp", "fp8"}));
  app.add_option("--fp8-recipe", fp8_recipe,
                 "with --precision fp8: current (each scale from the tensor itself, one pass more; never saturates) "
                 "or delayed (from each tensor's amax history; saturates when an amax grows past it)")
      ->capture_default_str()
      ->check(example::one_of({"delayed", "current"}));
  app.add_option("--fp8-history", fp8_history, "with --fp8-recipe delayed: amaxes kept per tensor")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--fp8-margin", fp8_margin, "with --precision fp8: scales lowered by 2^margin (headroom)")
      ->capture_default_str()
      ->check(example::range(-64, 64));
}

// ------------------------------------------------------------------ training

namespace {

mt::train::TrainerOptions trainer_options(const mt::nn::CausalLM& model, const TrainFlags& flags,
                                          const example::Placement& placement, const std::string& tag) {
  mt::train::TrainerOptions o;
  o.name = tag;
  o.steps = flags.steps;
  o.accumulation = flags.grad_accum;
  o.optimizer.lr = flags.lr;
  o.optimizer.warmup = flags.warmup;
  o.optimizer.min_lr_ratio = flags.min_lr_ratio;
  o.optimizer.weight_decay = flags.weight_decay;
  o.optimizer.decay_embeddings = !flags.no_embedding_decay;
  o.optimizer.grad_clip = flags.grad_clip;
  o.device = placement.device;
  o.amp = placement.amp;
  if (flags.precision == "fp8") {
    const int margin = static_cast<int>(flags.fp8_margin);
    o.fp8 = flags.fp8_recipe == "current"
                ? mt::Fp8Recipe::current(margin)
                : mt::Fp8Recipe::delayed(static_cast<int>(flags.fp8_history), mt::DelayedScaling::Amax::max, margin);
  }
  o.group = placement.group;
  o.eval_every = flags.eval_every;
  o.eval_batches = flags.eval_batches;
  flags.checkpoints.apply_to(o);
  o.log_every = flags.log_every;
  o.progress = flags.progress == "bar"     ? mt::train::ProgressMode::bar
               : flags.progress == "lines" ? mt::train::ProgressMode::lines
                                           : mt::train::ProgressMode::automatic;
  o.metrics = {flags.metrics, flags.tensorboard};
  o.flops_per_token = mt::train::transformer_flops_per_token(model.num_parameters(), model.num_layers(),
                                                             model.hidden_size(), flags.seq_len);
  if (flags.peak_tflops > 0) o.peak_flops = flags.peak_tflops * 1e12;
  o.report = flags.report;
  o.nvtx = flags.nvtx;
  o.cuda_graph = flags.cuda_graph;
  o.deterministic = flags.deterministic;
  o.detect_anomaly = flags.detect_anomaly;
  return o;
}

mt::data::BatcherOptions batches(const TrainFlags& flags, const example::Placement& placement, bool shuffle) {
  return mt::data::BatcherOptions(flags.batch_size, flags.seq_len)
      .seed(flags.seed)
      .shuffle(shuffle)
      .rank(placement.rank())
      .world_size(placement.world_size());
}

}  // namespace

namespace {

// The batches of `path` as --examples says: stream windows, packed or padded examples.
std::unique_ptr<mt::train::DataSource> data_source(const std::string& path, const TrainFlags& flags,
                                                   const mt::data::BatcherOptions& options) {
  if (flags.examples == "stream") return std::make_unique<mt::train::TokenData>(path, options);
  return std::make_unique<mt::train::PackedTokenData>(
      path, options, flags.examples == "packed" ? mt::train::PackedLayout::packed : mt::train::PackedLayout::padded);
}

int64_t batches_per_epoch(const mt::train::DataSource& data) {
  if (const auto* windows = dynamic_cast<const mt::train::TokenData*>(&data)) return windows->batches_per_epoch();
  return dynamic_cast<const mt::train::PackedTokenData&>(data).batcher().batches_per_epoch(0);
}

// A batch's mean loss: packed rows through the model's packed_loss.
mt::Tensor loss_of(const mt::nn::CausalLM& model, const mt::train::Batch& b) {
  if (b.positions.defined()) return model.packed_loss(b.inputs, b.targets, {b.positions, b.segments});
  return model.loss(b.inputs, b.targets);
}

}  // namespace

double evaluate(mt::nn::CausalLM& model, const std::string& path, const TrainFlags& flags,
                const example::Placement& placement) {
  mt::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const auto data = data_source(path, flags, mt::data::BatcherOptions(flags.batch_size, flags.seq_len).shuffle(false));
  const int64_t n = std::min(flags.eval_batches, batches_per_epoch(*data));
  double weighted = 0, counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    mt::train::Batch batch = data->next();
    if (batch.count == 0) continue;  // every target masked: nothing to average
    for (mt::Tensor* t : {&batch.inputs, &batch.targets, &batch.positions, &batch.segments}) {
      if (t->defined()) *t = t->to(placement.device);
    }
    mt::AutocastGuard autocast(placement.device.type, placement.amp.value_or(mt::DType::bf16),
                               placement.amp.has_value());
    const double loss = loss_of(model, batch).item();
    weighted += loss * static_cast<double>(batch.count);
    counted += static_cast<double>(batch.count);
  }
  model.train(was_training);
  MT_CHECK(counted > 0, path, ": the first ", n, " validation batches hold no target outside the loss mask");
  return weighted / counted;
}

namespace {

// --max-memory in bytes; its errors name the flag. FP8 is refused: every plan but "off" recomputes
// layers, which FP8 Linear layers cannot (a recomputed block would not repeat its scales).
int64_t memory_budget(const TrainFlags& flags) {
  MT_CHECK(flags.precision != "fp8",
           "--max-memory plans layer recomputation, which --precision fp8 cannot run; "
           "choose --checkpoint off or selective");
  try {
    return mt::train::parse_memory_size(flags.max_memory);
  } catch (const mt::Error& e) {
    throw mt::Error(std::string("--max-memory: ") + e.what());
  }
}

}  // namespace

mt::train::MemoryEstimate plan_memory(const mt::nn::LlamaConfig& config, const TrainFlags& flags,
                                      const MemorySetup& setup) {
  mt::train::TrainingShape shape;
  shape.batch = flags.batch_size;
  shape.seq_len = flags.seq_len;
  shape.lora_r = setup.lora_r;
  if (!setup.lora_targets.empty()) shape.lora_targets = setup.lora_targets;
  shape.base_dtype = setup.base_dtype;
  if (flags.max_memory.empty()) return mt::train::estimate_training_memory(config, shape, flags.checkpoint);
  return mt::train::plan_checkpointing(config, shape, memory_budget(flags));
}

mt::train::MemoryEstimate plan_memory(const std::string& config_json_path, const TrainFlags& flags,
                                      const MemorySetup& setup) {
  const std::string type = mt::nn::model_type_of(config_json_path);
  MT_CHECK_T(mt::FileError, type == "llama" || type == "mistral" || type == "qwen2", config_json_path,
             ": --max-memory and --dry-run plan Llama-family models (llama, mistral, qwen2), not \"",
             type.empty() ? "gpt2" : type, "\"; choose --checkpoint off, blocks or blocks:K instead");
  return plan_memory(mt::nn::LlamaConfig::from_json_file(config_json_path), flags, setup);
}

void print_memory_plan(const std::string& tag, const std::string& config_json_path, const TrainFlags& flags,
                       const MemorySetup& setup) {
  const mt::train::MemoryEstimate plan = plan_memory(config_json_path, flags, setup);
  std::printf("%s: %lld x %lld tokens per micro-batch, checkpointing %s%s: planned peak %s\n", tag.c_str(),
              static_cast<long long>(flags.batch_size), static_cast<long long>(flags.seq_len),
              plan.checkpointing.c_str(), flags.max_memory.empty() ? "" : (" (fits " + flags.max_memory + ")").c_str(),
              plan.summary().c_str());
}

TrainResult train(mt::nn::CausalLM& model, const TrainFlags& flags, const example::Placement& placement,
                  const std::string& tag, const MemorySetup& memory) {
  MT_CHECK(!flags.checkpoints.resume || !flags.checkpoints.save_dir.empty(), "--resume needs --save-dir");
  MT_CHECK(flags.checkpoints.stop_at == 0 || !flags.checkpoints.save_dir.empty(), "--stop-at needs --save-dir");
  MT_CHECK(!flags.cuda_graph || placement.device.is_cuda(), "--cuda-graph needs a CUDA device");
  if (!flags.max_memory.empty()) memory_budget(flags);  // a bad size before anything runs
  MT_CHECK(flags.precision != "fp8" || placement.amp == mt::DType::bf16,
           "--precision fp8 runs the Linear layers in FP8 inside bf16 autocast and needs --amp bf16 (auto is bf16 "
           "on a GPU only); got ",
           !placement.amp                     ? "off (f32)"
           : *placement.amp == mt::DType::f16 ? "fp16"
                                              : mt::dtype_name(*placement.amp));
  {
    const mt::data::TokenCorpus corpus(flags.data);  // checked before windows are cut from it
    MT_CHECK(corpus.vocab_size() <= model.vocab_size(), flags.data, ": the token file's vocab_size ",
             corpus.vocab_size(), " is larger than the model's vocab_size ", model.vocab_size());
  }
  MT_CHECK(flags.examples != "packed" || model.supports_packing(), "--examples packed: ", model.model_type(),
           " models do not implement packed sequences (the Llama family does); use --examples padded or stream");
  const auto data = data_source(flags.data, flags, batches(flags, placement, /*shuffle=*/true));
  MT_CHECK(flags.seq_len <= model.max_positions(), "--seq-len ", flags.seq_len,
           " exceeds the model's longest sequence ", model.max_positions());
  MT_CHECK(!flags.cuda_graph || model.dropout() == 0, "--cuda-graph needs dropout 0 (the model has ", model.dropout(),
           "): a replayed step would draw the same random numbers every time");
  if (flags.max_memory.empty()) {
    model.set_checkpointing(flags.checkpoint);
  } else {
    const auto* llama = dynamic_cast<const mt::nn::Llama*>(&model);
    MT_CHECK(llama != nullptr, "--max-memory plans Llama-family models (llama, mistral, qwen2), not ",
             model.model_type(), "; choose --checkpoint off, blocks or blocks:K instead");
    const mt::train::MemoryEstimate plan = plan_memory(llama->config(), flags, memory);
    model.set_checkpointing(plan.checkpointing);
    if (placement.is_main()) {
      std::printf("%s: memory plan for %s: %s\n", tag.c_str(), flags.max_memory.c_str(), plan.summary().c_str());
    }
  }
  // A recomputed block could not repeat the FP8 scales of its first pass (ops/fp8/fp8_linear.h).
  MT_CHECK(flags.precision != "fp8" ||
               mt::nn::GPTCheckpointing::parse(model.checkpointing()).recomputed(model.num_layers()) == 0,
           "--precision fp8 cannot run with --checkpoint ", model.checkpointing(),
           ": recomputing a block would not repeat its FP8 scales; use --checkpoint selective or off");
  if (!flags.trace.empty()) mt::nvtx::start_trace(flags.trace);

  mt::train::Trainer trainer(
      model, *data, [&model](const mt::train::Batch& b) { return loss_of(model, b); },
      trainer_options(model, flags, placement, tag));
  std::unique_ptr<mt::train::DataSource> validation;
  if (!flags.val_data.empty()) {
    validation = data_source(flags.val_data, flags, batches(flags, placement, /*shuffle=*/false));
    trainer.set_validation(*validation);
  }
  if (placement.is_main()) {
    std::printf("%s: gradient checkpointing %s\n", tag.c_str(), model.checkpointing().c_str());
  }
  const mt::train::TrainResult run = trainer.fit();
  if (!flags.trace.empty()) {
    mt::nvtx::stop_trace();
    if (placement.is_main()) std::printf("%s: NVTX ranges traced to %s\n", tag.c_str(), flags.trace.c_str());
  }
  return TrainResult{run.interrupted, run.first_loss, run.last_loss, run.val_loss, run.seconds};
}

// ------------------------------------------------------------------ text

std::unique_ptr<mt::tok::Tokenizer> tokenizer_for(const std::string& flag, const std::string& model_dir) {
  if (!flag.empty()) return mt::tok::load_tokenizer(flag);
  for (const char* file : {"tokenizer.json", "vocab.json", "tokenizer.model"}) {
    if (!model_dir.empty() && std::filesystem::exists(std::filesystem::path(model_dir) / file)) {
      return mt::tok::load_tokenizer(model_dir);
    }
  }
  return mt::tok::load_tokenizer("bytes");
}

std::string tokenizer_directory(const std::string& flag) {
  if (flag.empty() || flag == "bytes") return "";
  return std::filesystem::is_directory(flag) ? flag : std::filesystem::path(flag).parent_path().string();
}

std::shared_ptr<mt::nn::CausalLM> model_from_config(const std::string& config_path, mt::Generator* generator) {
  const std::string type = mt::nn::model_type_of(config_path);
  if (type == "gpt2" || type.empty()) {  // GPT-2 configs may omit model_type
    return std::make_shared<mt::nn::GPT>(mt::nn::GPTConfig::from_json_file(config_path), generator);
  }
  MT_CHECK_T(mt::FileError, type == "llama" || type == "mistral" || type == "qwen2", config_path, ": model_type \"",
             type, "\" is not supported (gpt2, llama, mistral, qwen2)");
  return std::make_shared<mt::nn::Llama>(mt::nn::LlamaConfig::from_json_file(config_path), generator);
}

namespace {

// Control characters other than newline and tab as "\x1b", byte by byte, so that pieces of a
// text come out as the whole does.
std::string printable(std::string_view text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f)) {
      out += ch;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// Note [Streaming decoded text]: a token may end inside a character. Byte-level BPE and the byte
// tokenizer give some characters one byte per token, and SentencePiece spells rare ones as byte
// tokens ("<0xE2>"); a decoder also depends on a token's neighbours (SentencePiece drops the
// space of the first piece only). So the ids drawn so far are decoded together, and what is
// printed is the text past what has been printed, less a tail that may still become a character:
// trailing U+FFFD (what a decoder gives for bytes that are not a character yet) or the start of
// a UTF-8 sequence without all its bytes (the byte tokenizer's decode keeps bytes as they are).
// That tail is printed once a later token completes it, or at the end, as it is. The decoded
// text of the ids before a new one never changes with it (each decoder here is prefix-stable),
// so the pieces add up to the text of all the ids.

// The length of the part of `text` that no later token can change (see the note above).
size_t settled_length(const std::string& text) {
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  size_t end = text.size();
  while (end >= kReplacement.size() &&
         text.compare(end - kReplacement.size(), kReplacement.size(), kReplacement) == 0) {
    end -= kReplacement.size();
  }
  if (end < text.size()) return end;
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for the lead
    const size_t needed = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < needed ? end - back : end;
  }
  return end;
}

}  // namespace

std::string TextStream::give_out(bool all) {
  const std::string decoded = tokenizer_.decode(ids_, /*skip_special_tokens=*/true);
  const size_t settled = all ? decoded.size() : settled_length(decoded);
  if (settled <= shown_) return "";
  std::string piece = printable(std::string_view(decoded).substr(shown_, settled - shown_));
  shown_ = settled;
  text_ += piece;
  return piece;
}

std::string TextStream::add(const std::vector<int64_t>& ids) {
  for (const int64_t id : ids) {
    if (id >= 0 && id < tokenizer_.vocab_size()) ids_.push_back(static_cast<mt::tok::TokenId>(id));
  }
  return give_out(/*all=*/false);
}

std::string TextStream::finish() { return give_out(/*all=*/true); }

SampleResult sample(const mt::nn::CausalLM& model, const mt::tok::Tokenizer& tokenizer, const std::string& prompt,
                    const SampleOptions& options, const std::function<void(const std::string&)>& on_text) {
  mt::tok::check_vocab_fits(tokenizer, model.vocab_size(), "sampling");
  const std::vector<mt::tok::TokenId> encoded = tokenizer.encode(prompt, /*add_special_tokens=*/true);
  const std::vector<int64_t> ids(encoded.begin(), encoded.end());
  SampleResult result;
  result.prompt_tokens = static_cast<int64_t>(ids.size());
  TextStream stream(tokenizer);
  const auto give = [&](const std::string& piece) {
    if (on_text && !piece.empty()) on_text(piece);
  };
  give(stream.add(ids));

  mt::nn::GenerateOptions generate;
  generate.max_new_tokens = options.new_tokens;
  generate.temperature = options.temperature;
  generate.top_k = options.top_k;
  generate.top_p = options.top_p;
  generate.stop_token = options.stop_token;
  generate.use_cache = options.use_cache;
  generate.on_token = [&](int64_t id) {
    ++result.new_tokens;
    give(stream.add({id}));
  };
  mt::Generator generator(options.seed);
  const auto start = std::chrono::steady_clock::now();
  mt::nn::generate(model, ids, generate, &generator);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  give(stream.finish());
  result.text = stream.text();
  return result;
}

std::string sample_text(const mt::nn::CausalLM& model, const mt::tok::Tokenizer& tokenizer, const std::string& prompt,
                        const SampleOptions& options) {
  return sample(model, tokenizer, prompt, options).text;
}

}  // namespace lm_example
