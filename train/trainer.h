// The training loop as a library: a user passes a model, training data, a loss function and
// options; the Trainer owns everything else a step needs and everything around the steps.
//
//   mt::train::TokenData data("train.tok", mt::data::BatcherOptions(16, 256).seed(1337));
//   mt::train::TrainerOptions options;
//   options.steps = 1000;
//   options.optimizer.lr = 6e-4;
//   options.device = mt::cuda_device(0);
//   options.amp = mt::DType::bf16;
//   mt::train::Trainer trainer(model, data, [&](const mt::train::Batch& b) {
//     return model.loss(b.inputs, b.targets);   // the mean loss of one micro-batch
//   }, options);
//   trainer.fit();
//
// A step (Note [The Trainer's step]): `accumulation` micro-batches, each forward and loss under
// autocast (when options.amp is set), its loss weighted by its share of the step's targets
// (Batch::count) and scaled (f16 only), then backward; under mpirun the gradients are averaged
// over the ranks as backward produces them (DistributedDataParallel, overlapped; the first
// micro-batches accumulate locally); then unscale, gradient clipping, the AdamW update (skipped
// by the loss scaler on overflow), the scaler's update and the warm-up + cosine schedule. The
// accumulated step equals one step on all the micro-batches at once: the mean over every target
// of the accumulated batch. Nothing in a step reads the device back except on logged steps.
//
// With options.fp8 the Linear layers run in FP8 inside the bf16 autocast (ops/fp8/fp8_autocast.h),
// validation too, on copies of the FP8 states so that it leaves the training run as it was
// (nn::Fp8StateRestoreGuard); logged steps then report the delayed-scaling states' health
// (fp8_overflows since the last record, fp8_scale_min, fp8_scale_max; over all ranks).
//
// Around the steps: progress (a bar on a terminal, lines elsewhere: train/progress.h), metrics
// files (train/metrics.h), validation every eval_every steps and at the end, checkpoints every
// save_every steps, at the end and on SIGTERM/SIGINT/SIGUSR1 (Note [Stopping on a signal]),
// exact resume from the newest checkpoint, NVTX ranges (step, forward, backward, optimizer; the
// modules by path), and an end-of-run report of where the time and memory went. Under mpirun
// only rank 0 prints and writes files; its figures hold for all ranks (the loss is the mean over
// ranks, tokens/s counts every rank; device memory is rank 0's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "distributed/process_group.h"
#include "ops/fp8/fp8_autocast.h"
#include "ops/nn/module.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "train/data_source.h"
#include "train/metrics.h"
#include "train/progress.h"

namespace mt::train {

// The mean loss of one micro-batch, whose tensors are on the Trainer's device; called inside
// the autocast region. The result must be a 0-d (or one-element) tensor.
using LossFn = std::function<Tensor(const Batch& batch)>;

// AdamW, its parameter groups and its schedule.
struct OptimizerConfig {
  double lr = 1e-3;  // the peak learning rate
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.1;     // on matrices only (train/param_groups.h)
  bool decay_embeddings = true;  // false: embedding tables are not decayed either
  int64_t warmup = 0;            // linear warm-up steps from lr/(warmup+1), then a cosine
  double min_lr_ratio = 0.1;     // the cosine ends at lr * min_lr_ratio on the last step
  double grad_clip = 1.0;        // clip the global gradient norm to this; 0: no clipping
};

struct TrainerOptions {
  std::string name = "train";  // the first word of every line printed
  int64_t steps = 1000;        // optimizer steps
  int64_t accumulation = 1;    // micro-batches per optimizer step
  OptimizerConfig optimizer;

  Device device = kCPU;
  std::optional<DType> amp;             // autocast dtype (bf16, f16); empty: f32
  std::optional<Fp8Recipe> fp8;         // Linear layers in FP8 under this recipe (amp must be bf16); empty: off
  dist::ProcessGroup* group = nullptr;  // under mpirun: data parallel over its ranks

  int64_t eval_every = 0;    // validation every N steps (and after the last); 0: after the last only
  int64_t eval_batches = 8;  // micro-batches per validation

  std::string save_dir;    // training checkpoints; empty: none (and no stopping on signals)
  int64_t save_every = 0;  // 0: after the last step and when stopped only
  int64_t keep = 3;        // checkpoints kept
  int64_t stop_at = 0;     // stop after this step as a signal would (0: never)
  bool resume = false;     // continue from the newest checkpoint in save_dir

  int64_t log_every = 25;  // steps between progress lines and metrics records
  ProgressMode progress = ProgressMode::automatic;
  MetricsOptions metrics;  // JSON lines and TensorBoard files (rank 0)
  bool quiet = false;      // print nothing (metrics files are still written)

  double flops_per_token = 0;        // for MFU (train/throughput.h); 0: no MFU
  std::optional<double> peak_flops;  // the device's peak FLOP/s; empty: device_peak_flops()

  bool report = false;          // profile a few steps and print where time and memory went at the end
  bool nvtx = false;            // NVTX ranges on (also MT_NVTX=1)
  bool cuda_graph = false;      // capture the step once and replay it (one GPU, fixed batch shapes)
  bool deterministic = false;   // repeatable kernels (a resumed GPU run repeats an uninterrupted one)
  bool detect_anomaly = false;  // stop at the first op whose output is NaN or inf, naming it (slow)
};

// What callbacks and fit() report about a logged step.
struct StepMetrics {
  int64_t step = 0;
  Scalars scalars;                              // the metrics record: loss, lr, grad_norm, tokens_per_s, ...
  double value(const std::string& name) const;  // NaN when absent
};

struct TrainResult {
  bool interrupted = false;              // stopped by a signal or stop_at, after a checkpoint
  int64_t last_step = 0;                 // the last step run
  double first_loss = 0, last_loss = 0;  // training loss of the first and last logged steps
  std::optional<double> val_loss;        // the last validation, when there is validation data
  double seconds = 0;
  std::string report;  // with options.report: the end-of-run report (also printed)
};

class Trainer {
 public:
  Trainer(nn::Module& model, DataSource& train_data, LossFn loss, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Validation data: eval_batches micro-batches from its position now, the same ones each time.
  void set_validation(DataSource& data);

  // Callbacks for user code, run on every rank (check the group's rank to print once).
  void on_step_end(std::function<void(const StepMetrics&)> callback);  // logged steps
  void on_validation(std::function<void(int64_t step, double loss)> callback);
  void on_save(std::function<void(int64_t step, const std::string& path)> callback);  // rank 0

  TrainResult fit();
  // The validation loss now (every rank takes part under mpirun).
  double evaluate();

  AdamW& optimizer();
  GradScaler& scaler();
  LRScheduler& scheduler();
  const TrainerOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::train
