#include "examples/gpt/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "autograd/anomaly.h"
#include "core/cuda_context.h"
#include "core/data/byte_tokenizer.h"
#include "distributed/ddp.h"
#include "ops/backends.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/graph_step.h"
#include "optim/lr_scheduler.h"
#include "optim/training_checkpoint.h"

namespace gpt_example {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

namespace {

// "peak mem 12.34 GiB": the allocator's high-water mark since training began.
std::string peak_memory_text(const mt::Device& device) {
  return example::format("peak mem %.2f GiB", static_cast<double>(mt::cuda::memory_stats(device.index).peak_allocated) /
                                                  (1024.0 * 1024.0 * 1024.0));
}

}  // namespace

// ------------------------------------------------------------------ flags

void TrainFlags::add_to(CLI::App& app, const std::string& data_help) {
  app.add_option("--data", data, data_help)->required()->check(CLI::ExistingFile);
  app.add_option("--val-data", val_data, "validation token file (loss reported after training)")
      ->check(CLI::ExistingFile);
  app.add_option("--steps", steps, "optimizer steps")->capture_default_str()->check(example::positive());
  app.add_option("--batch-size", batch_size, "sequences per step")->capture_default_str()->check(example::positive());
  app.add_option("--seq-len", seq_len, "tokens per sequence")->capture_default_str()->check(example::positive());
  app.add_option("--lr", lr, "peak learning rate (AdamW)")->capture_default_str()->check(example::positive());
  app.add_option("--warmup", warmup, "linear warm-up steps, then cosine decay")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--min-lr-ratio", min_lr_ratio, "final lr as a fraction of the peak")
      ->capture_default_str()
      ->check(example::range(0.0, 1.0));
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--grad-clip", grad_clip, "clip the global gradient norm to this (0: off)")
      ->capture_default_str()
      ->check(example::non_negative());
  example::add_seed(app, seed, "initialisation, batches, dropout and the sample");
  app.add_option("--log-every", log_every, "steps between progress lines")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--checkpoint", checkpoint,
                 "gradient checkpointing: off, blocks (every block), blocks:K (every K-th), or selective "
                 "(recompute attention only)")
      ->capture_default_str();
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
}

// ------------------------------------------------------------------ training

double evaluate(mt::nn::GPT& model, const mt::data::TokenFile& file, int64_t batch_size, int64_t seq_len,
                int64_t batches, const example::Placement& placement) {
  mt::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  mt::data::TokenBatcher batcher(file, mt::data::BatcherOptions(batch_size, seq_len).shuffle(false));
  const int64_t n = std::min(batches, batcher.batches_per_epoch());
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const mt::data::Batch batch = batcher.next();
    mt::AutocastGuard autocast(placement.device.type, placement.amp.value_or(mt::DType::bf16),
                               placement.amp.has_value());
    total += model.loss(batch.inputs.to(placement.device), batch.targets.to(placement.device)).item();
  }
  model.train(was_training);
  return total / static_cast<double>(n);
}

TrainResult train(mt::nn::GPT& model, const std::vector<mt::Tensor>& params, const TrainFlags& flags,
                  const example::Placement& placement, const std::string& tag) {
  const mt::data::TokenFile data(flags.data);
  MT_CHECK(data.vocab_size() <= model.config().vocab_size, flags.data, ": the token file's vocab_size ",
           data.vocab_size(), " is larger than the model's vocab_size ", model.config().vocab_size);
  MT_CHECK(flags.seq_len <= model.config().n_positions, "--seq-len ", flags.seq_len,
           " exceeds the model's n_positions ", model.config().n_positions);
  mt::data::TokenBatcher batcher(data, mt::data::BatcherOptions(flags.batch_size, flags.seq_len)
                                           .seed(flags.seed)
                                           .rank(placement.group != nullptr ? placement.group->rank() : 0)
                                           .world_size(placement.world_size()));
  std::optional<mt::dist::DistributedDataParallel> ddp;
  if (placement.world_size() > 1) ddp.emplace(model, *placement.group);
  const mt::nn::GPTCheckpointing checkpointing = mt::nn::GPTCheckpointing::parse(flags.checkpoint);
  model.set_checkpointing(checkpointing);

  mt::AdamWOptions adamw = mt::AdamWOptions(flags.lr).weight_decay(flags.weight_decay);
  if (placement.amp) adamw.autocast_copies(*placement.amp);  // the step writes the forward's low-precision weights
  mt::AdamW optimizer(params, adamw);
  mt::WarmupCosineLR schedule(optimizer, std::min(flags.warmup, flags.steps), flags.steps, flags.min_lr_ratio);
  // f16 has 5 exponent bits and needs loss scaling; bf16 has f32's range and needs none.
  const bool fp16 = placement.amp == mt::DType::f16;
  mt::GradScaler scaler(placement.device, mt::GradScalerOptions().enabled(fp16));

  if (placement.is_main()) {
    std::printf(
        "%s: %s tokens in %s, %lld batches of %lldx%lld per epoch and rank, %lld steps on %s, "
        "checkpointing %s\n",
        tag.c_str(), with_commas(data.size()).c_str(), flags.data.c_str(),
        static_cast<long long>(batcher.batches_per_epoch()), static_cast<long long>(flags.batch_size),
        static_cast<long long>(flags.seq_len), static_cast<long long>(flags.steps), placement.describe().c_str(),
        checkpointing.str().c_str());
  }
  if (placement.device.is_cuda()) mt::cuda::reset_peak_memory(placement.device.index);
  std::fflush(stdout);

  // Training checkpoints and resuming (rank 0 writes; every rank reads the same file).
  std::optional<mt::CheckpointDirectory> saves = flags.checkpoints.open();
  mt::TrainingState checkpoint_state{&model, &optimizer, &scaler, &schedule, {}};
  int64_t first_step = 1;
  if (flags.checkpoints.resume) {
    if (const auto latest = saves->latest()) {
      mt::load_training_checkpoint(*latest, checkpoint_state);
      const auto& extra = checkpoint_state.extra;
      for (const char* key : {"step", "epoch", "index", "seed"}) {
        MT_CHECK_T(mt::FileError, extra.count(key), *latest, ": not a ", tag, " checkpoint (no '", key, "')");
      }
      first_step = static_cast<int64_t>(extra.at("step")) + 1;
      batcher.restore({static_cast<int64_t>(extra.at("epoch")), static_cast<int64_t>(extra.at("index")),
                       static_cast<uint64_t>(extra.at("seed"))});
      if (placement.is_main())
        std::printf("%s: resumed from %s at step %lld\n", tag.c_str(), latest->c_str(),
                    static_cast<long long>(first_step - 1));
    } else if (placement.is_main()) {
      std::printf("%s: no checkpoint in %s; starting from step 1\n", tag.c_str(), flags.checkpoints.save_dir.c_str());
    }
  }
  auto save_checkpoint = [&](int64_t step) {
    const mt::data::BatcherState position = batcher.state();
    checkpoint_state.extra = {{"step", static_cast<double>(step)},
                              {"epoch", static_cast<double>(position.epoch)},
                              {"index", static_cast<double>(position.index)},
                              {"seed", static_cast<double>(position.seed)}};
    if (!placement.is_main()) return;
    const std::string path = saves->save(step, checkpoint_state);
    std::printf("%s: checkpoint %s\n", tag.c_str(), path.c_str());
    std::fflush(stdout);
  };

  MT_CHECK(!flags.cuda_graph || placement.device.is_cuda(), "--cuda-graph needs a CUDA device");
  MT_CHECK(!flags.cuda_graph || placement.world_size() == 1,
           "--cuda-graph is for one process (NCCL's collectives are not captured)");
  MT_CHECK(!flags.cuda_graph || !flags.detect_anomaly,
           "--cuda-graph and --detect-anomaly exclude each other: the anomaly mode reads every output back");
  MT_CHECK(!flags.cuda_graph || model.config().dropout == 0, "--cuda-graph needs dropout 0 (the model has ",
           model.config().dropout, "): a replayed step would draw the same random numbers every time");
  // The step reads its batch from tensors that stay put (a captured step reads the same
  // addresses every replay) and leaves its loss in loss_out.
  const mt::TensorOptions ids = mt::TensorOptions().dtype(mt::DType::i64).device(placement.device);
  const mt::Tensor inputs = mt::empty({flags.batch_size, flags.seq_len}, ids);
  const mt::Tensor targets = mt::empty({flags.batch_size, flags.seq_len}, ids);
  const mt::Tensor loss_out = mt::zeros({1}, mt::TensorOptions().device(placement.device));
  auto train_step = [&] {
    mt::Tensor loss;
    {
      mt::AutocastGuard autocast(placement.device.type, placement.amp.value_or(mt::DType::bf16),
                                 placement.amp.has_value());
      loss = model.loss(inputs, targets);
    }
    if (ddp) {
      ddp->zero_grad();  // gradients as views into the all-reduce buckets
    } else {
      optimizer.zero_grad(/*set_to_none=*/!flags.cuda_graph);  // a captured step keeps its buffers
    }
    scaler.scale(loss).backward();
    if (ddp && flags.grad_clip <= 0 && !fp16) {
      // No loss scaler, no clipping: nothing needs every gradient at once, so the update of the early
      // buckets can hide the last all-reduce.
      ddp->step(optimizer);
    } else {
      if (ddp) ddp->synchronize();  // every rank now holds the average gradient
      if (flags.grad_clip > 0) {
        scaler.unscale_(optimizer);
        mt::clip_grad_norm_(params, flags.grad_clip);
      }
      scaler.step(optimizer);
      scaler.update();
    }
    loss_out.copy_(loss.detach().reshape({1}));
  };
  mt::CudaGraphStep graph_step(placement.device, train_step, {&optimizer}, /*warmup=*/2, flags.cuda_graph);

  TrainResult result;
  const mt::AnomalyGuard anomaly(flags.detect_anomaly);
  if (flags.deterministic) mt::backends::set_deterministic_algorithms(true);
  model.train();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = first_step; step <= flags.steps; ++step) {
    const mt::data::Batch batch = batcher.next();
    inputs.copy_(batch.inputs);
    targets.copy_(batch.targets);
    graph_step.run();
    // A replayed step runs no host code: the loss scaler's limits are checked here instead.
    if (fp16 && graph_step.captured() && step % 100 == 0) scaler.check_limits();
    const double lr = schedule.last_lr();
    schedule.step();
    if (saves) {
      const std::string stop = example::stop_reason(step, flags.checkpoints, placement.group);
      if (!stop.empty() || flags.checkpoints.due(step, flags.steps)) save_checkpoint(step);
      if (!stop.empty()) {
        if (placement.is_main())
          std::printf("%s: stopped after step %lld (%s)\n", tag.c_str(), static_cast<long long>(step), stop.c_str());
        result.interrupted = true;
        break;
      }
    }

    if (step == first_step || step % flags.log_every == 0 || step == flags.steps) {
      // The only read-back of a step, and only when logging; averaged over the ranks.
      const double value =
          placement.world_size() > 1 ? placement.group->mean_over_ranks(loss_out.item()) : loss_out.item();
      if (!std::isfinite(value) && !fp16) {
        throw mt::Error("the loss is " + std::to_string(value) + " at step " + std::to_string(step) +
                        "; lower --lr or check the data");
      }
      if (step == first_step) result.first_loss = value;
      result.last_loss = value;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const int64_t steps_run = step - first_step + 1;  // in this process (after a resume, not from 1)
      const double tokens = static_cast<double>(steps_run * flags.batch_size * flags.seq_len * placement.world_size());
      if (!placement.is_main()) continue;
      // The loss scale as it is: after many skipped steps it falls below 1.
      std::vector<std::string> fields = {
          example::format("loss %.4f", value), example::format("lr %.2e", lr),
          with_commas(static_cast<int64_t>(tokens / seconds)) + " tok/s",
          "loss scale " + example::loss_scale_text(fp16 ? std::optional<double>(scaler.get_scale()) : std::nullopt)};
      if (placement.device.is_cuda()) fields.push_back(peak_memory_text(placement.device));
      std::printf("%s\n", example::progress_line(tag, step, flags.steps, fields, seconds, steps_run).c_str());
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!flags.val_data.empty()) {
    const mt::data::TokenFile val(flags.val_data);
    result.val_loss = evaluate(model, val, flags.batch_size, flags.seq_len, flags.eval_batches, placement);
    if (placement.is_main()) {
      std::printf("%s: validation loss %.4f (%s)\n", tag.c_str(), *result.val_loss, flags.val_data.c_str());
    }
  }
  return result;
}

// ------------------------------------------------------------------ text

std::string sample_text(const mt::nn::GPT& model, const std::string& prompt, int64_t new_tokens, double temperature,
                        int64_t top_k, uint64_t seed) {
  const mt::data::ByteTokenizer tokenizer;
  const std::vector<uint16_t> encoded = tokenizer.encode(prompt);
  std::vector<int64_t> ids(encoded.begin(), encoded.end());
  mt::Generator generator(seed);
  const std::vector<int64_t> out =
      mt::nn::generate(model, ids, mt::nn::GenerateOptions{new_tokens, temperature, top_k}, &generator);
  std::string text;
  for (unsigned char c : tokenizer.decode(out)) {
    if (c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f)) {
      text += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      text += buf;
    }
  }
  return text;
}

}  // namespace gpt_example
