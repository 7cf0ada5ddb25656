#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "autograd/anomaly.h"
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/error.h"
#include "core/format.h"
#include "core/nvtx.h"
#include "distributed/ddp.h"
#include "ops/backends.h"
#include "ops/nn/fp8_state_dict.h"
#include "ops/ops.h"
#include "optim/clip_grad.h"
#include "optim/graph_step.h"
#include "optim/training_checkpoint.h"
#include "train/param_groups.h"
#include "train/report.h"
#include "train/stop_signal.h"
#include "train/throughput.h"

namespace mt::train {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string format(const char* fmt, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), fmt, value);
  return text;
}

void check_options(const TrainerOptions& o, const nn::Module& model) {
  MT_CHECK(o.steps > 0, "Trainer: steps must be > 0, got ", o.steps);
  MT_CHECK(o.accumulation > 0, "Trainer: accumulation must be > 0, got ", o.accumulation);
  MT_CHECK(o.log_every > 0, "Trainer: log_every must be > 0, got ", o.log_every);
  MT_CHECK(o.eval_every >= 0 && o.eval_batches > 0, "Trainer: eval_every must be >= 0 and eval_batches > 0, got ",
           o.eval_every, " and ", o.eval_batches);
  MT_CHECK(o.optimizer.lr > 0, "Trainer: the learning rate must be > 0, got ", o.optimizer.lr);
  MT_CHECK(o.optimizer.warmup >= 0, "Trainer: warmup must be >= 0, got ", o.optimizer.warmup);
  MT_CHECK(o.optimizer.grad_clip >= 0, "Trainer: grad_clip must be >= 0, got ", o.optimizer.grad_clip);
  MT_CHECK(!o.resume || !o.save_dir.empty(), "Trainer: resuming needs a checkpoint directory (--save-dir)");
  MT_CHECK(o.stop_at == 0 || !o.save_dir.empty(),
           "Trainer: stopping at a step needs a checkpoint directory (--save-dir)");
  MT_CHECK(!o.cuda_graph || o.device.is_cuda(), "Trainer: CUDA Graphs need a CUDA device");
  MT_CHECK(!o.cuda_graph || o.group == nullptr || o.group->world_size() == 1,
           "Trainer: CUDA Graphs are for one process (NCCL's collectives are not captured)");
  MT_CHECK(!o.cuda_graph || !o.detect_anomaly,
           "Trainer: CUDA Graphs and anomaly detection exclude each other: the anomaly mode reads every output back");
  MT_CHECK(!o.cuda_graph || !o.report,
           "Trainer: the report profiles ops as they are launched, which a replayed CUDA Graph does not do");
  MT_CHECK(!model.trainable_parameters().empty(), "Trainer: the model has no trainable parameters");
  if (o.fp8) {
    MT_CHECK(o.amp == DType::bf16,
             "Trainer: FP8 (options.fp8) runs inside bf16 autocast, so options.amp must be bf16; got ",
             o.amp ? dtype_name(*o.amp) : "none (f32)");
    o.fp8->validate();
  }
}

// "fp8 ovf 0 scale 1.2e+01..3.4e+03": saturated casts since the last line, and the scales' range.
std::string fp8_field(double overflows, double min_scale, double max_scale) {
  char text[96];
  std::snprintf(text, sizeof(text), "fp8 ovf %.0f scale %.1e..%.1e", overflows, min_scale, max_scale);
  return text;
}

}  // namespace

double StepMetrics::value(const std::string& name) const {
  for (const auto& [key, v] : scalars) {
    if (key == name) return v;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

struct Trainer::Impl {
  Impl(nn::Module& model, DataSource& data, LossFn loss_fn, TrainerOptions options);

  bool is_main() const { return options.group == nullptr || options.group->is_main(); }
  int world_size() const { return options.group == nullptr ? 1 : options.group->world_size(); }
  double global_mean(double value) const { return world_size() > 1 ? options.group->mean_over_ranks(value) : value; }
  void print(const std::string& line) {
    if (options.quiet || !is_main()) return;
    if (bar) {
      bar->print(line);
    } else {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }

  void load_micro_batches();
  void stage(Tensor& mine, const Tensor& host, bool first) const;
  void run_step();  // what a CUDA Graph captures: the device work of one step
  double read_grad_norm();
  std::map<std::string, double> checkpoint_extra(int64_t step) const;
  void save_checkpoint(int64_t step);
  int64_t resume();
  double evaluate();
  void log_step(int64_t step, int64_t first_step, bool evaluated, double val_loss);
  void record_fp8_health(Scalars& scalars);

  nn::Module& model;
  DataSource& data;
  DataSource* validation = nullptr;
  std::map<std::string, double> validation_start;
  LossFn loss_fn;
  TrainerOptions options;
  std::vector<Tensor> params;
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<WarmupCosineLR> schedule;
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  bool fp16 = false;

  // The step's inputs live in tensors that stay put (a captured step reads the same addresses
  // every replay): one per micro-batch, filled from the data before each step.
  std::vector<Batch> device_batches;
  std::vector<Tensor> weights;     // [accumulation] 0-d f32 on the device: count_i / sum of counts
  Tensor loss_out;                 // [1] f32: the step's loss
  Tensor grad_norm_out;            // 0-d: the gradient norm before clipping (when clipping)
  int64_t step_targets = 0;        // targets of the step on this rank (Batch::count summed)
  double step_lr = 0;              // the learning rate of the step just run
  int64_t fp8_overflows_seen = 0;  // the FP8 states' overflow count at the last record (all ranks)

  std::vector<std::function<void(const StepMetrics&)>> step_callbacks;
  std::vector<std::function<void(int64_t, double)>> validation_callbacks;
  std::vector<std::function<void(int64_t, const std::string&)>> save_callbacks;

  std::optional<CheckpointDirectory> checkpoints;
  std::unique_ptr<MetricsLogger> metrics;
  std::unique_ptr<ProgressBar> bar;
  std::optional<double> peak_flops;
  ProgressMode progress_mode = ProgressMode::lines;

  // Figures between two records.
  std::chrono::steady_clock::time_point run_start, interval_start;
  double interval_excluded = 0;  // seconds of validation and checkpoints in the interval
  int64_t interval_steps = 0;
  double interval_targets = 0;  // all ranks
  TrainResult result;
  std::vector<std::string> last_fields;

  // The report: a few steps profiled once the run has warmed up (a profiler costs an event per op).
  void profile_around(int64_t step, int64_t first_step, bool run_ended);
  std::unique_ptr<OpProfiler> profiler;
  int64_t profiled_steps = 0;
  double profiled_seconds = 0;
  std::chrono::steady_clock::time_point profile_start;
};

void Trainer::Impl::profile_around(int64_t step, int64_t first_step, bool run_ended) {
  constexpr int64_t kWarmupSteps = 2, kProfiledSteps = 5;
  if (!options.report || !result.report.empty()) return;
  if (!profiler && step == first_step + kWarmupSteps && !run_ended) {
    profiler = std::make_unique<OpProfiler>(options.device);
    profile_start = std::chrono::steady_clock::now();
    return;
  }
  if (!profiler) return;
  profiler->step();
  ++profiled_steps;
  if (profiled_steps < kProfiledSteps && !run_ended) return;
  RunReportInput input;
  input.profiler = profiler.get();
  input.module_rows = profiler->module_rows();
  input.memory = memory_breakdown(model, *optimizer, options.device);  // the gradients still exist here
  input.steps = profiled_steps;
  input.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - profile_start).count();
  result.report = run_report(input);
  profiler.reset();
}

Trainer::Impl::Impl(nn::Module& model_, DataSource& data_, LossFn loss_fn_, TrainerOptions options_)
    : model(model_), data(data_), loss_fn(std::move(loss_fn_)), options(std::move(options_)) {
  check_options(options, model);
  const OptimizerConfig& oc = options.optimizer;
  std::vector<ParamGroup> groups = weight_decay_groups(model, {oc.weight_decay, oc.lr, oc.decay_embeddings});
  for (const ParamGroup& g : groups) params.insert(params.end(), g.params.begin(), g.params.end());
  if (world_size() > 1) ddp = std::make_unique<dist::DistributedDataParallel>(model, *options.group);

  AdamWOptions adamw = AdamWOptions(oc.lr).betas(oc.beta1, oc.beta2).eps(oc.eps).weight_decay(oc.weight_decay);
  // The update writes the forward's low-precision weights in the same pass (optim/weight_copies.h).
  if (options.amp && options.device.is_cuda()) adamw.autocast_copies(*options.amp);
  optimizer = std::make_unique<AdamW>(std::move(groups), adamw);
  schedule = std::make_unique<WarmupCosineLR>(*optimizer, std::min(oc.warmup, options.steps), options.steps,
                                              oc.min_lr_ratio, WarmupStart::above_zero);
  // f16 has 5 exponent bits and needs loss scaling; bf16 has f32's range and needs none.
  fp16 = options.amp == DType::f16;
  scaler = std::make_unique<GradScaler>(options.device, GradScalerOptions().enabled(fp16));

  const TensorOptions on_device = TensorOptions().device(options.device);
  loss_out = zeros({1}, on_device);
  for (int64_t i = 0; i < options.accumulation; ++i) weights.push_back(ones({}, on_device));
  peak_flops = options.peak_flops ? options.peak_flops : device_peak_flops(options.device, options.amp);
  // Under mpirun stdout may be a pseudo-terminal of mpirun's even when its output goes to a file.
  const bool bar_possible = is_main() && !options.quiet && (world_size() == 1 || options.progress == ProgressMode::bar);
  progress_mode = bar_possible ? options.progress : ProgressMode::lines;
  if (options.nvtx) nvtx::set_enabled(true);
  nn::name_modules_for_tracing(model, "model");  // ranges and the report's rows name modules by path
}

// Note [The Trainer's step]: the micro-batches are read and counted on the host first, so that
// each one's weight (its share of the step's targets) is known before any backward; the weights
// reach the device by a copy outside the step, which a captured graph can then replay.
// `host` copied into the device tensor `mine`, which keeps its storage while the shape and dtype
// stay (a captured step reads fixed addresses); undefined stays undefined (rows without packing).
void Trainer::Impl::stage(Tensor& mine, const Tensor& host, bool first) const {
  if (!host.defined()) {
    mine = Tensor();
    return;
  }
  if (!mine.defined() || mine.shape() != host.shape() || mine.dtype() != host.dtype()) {
    MT_CHECK(!options.cuda_graph || first, "Trainer: a captured step needs batches of one shape; got ",
             shape_str(host.shape()), " after ", mine.defined() ? shape_str(mine.shape()) : std::string("none"));
    mine = empty(host.shape(), TensorOptions().dtype(host.dtype()).device(options.device));
  }
  mine.copy_(host);
}

void Trainer::Impl::load_micro_batches() {
  std::vector<Batch> host(static_cast<size_t>(options.accumulation));
  step_targets = 0;
  for (Batch& b : host) {
    b = data.next();
    MT_CHECK(b.inputs.defined() && b.targets.defined(), "Trainer: the data source returned a batch without ",
             b.inputs.defined() ? "targets" : "inputs");
    step_targets += b.count;
  }
  const bool first = device_batches.empty();
  for (size_t i = 0; i < host.size(); ++i) {
    Batch& mine = first ? device_batches.emplace_back() : device_batches[i];
    stage(mine.inputs, host[i].inputs, first);
    stage(mine.targets, host[i].targets, first);
    stage(mine.positions, host[i].positions, first);
    stage(mine.segments, host[i].segments, first);
    mine.count = host[i].count;
  }
  if (options.accumulation > 1) {
    const bool counted = step_targets > 0;
    for (size_t i = 0; i < host.size(); ++i) {
      const double share = counted ? static_cast<double>(host[i].count) / static_cast<double>(step_targets)
                                   : 1.0 / static_cast<double>(options.accumulation);
      weights[i].copy_(full({}, share));
    }
  }
}

void Trainer::Impl::run_step() {
  const nvtx::Range step_range("step");
  if (ddp) {
    ddp->zero_grad();  // gradients as views into the all-reduce buckets
  } else {
    optimizer->zero_grad(/*set_to_none=*/!options.cuda_graph);  // a captured step keeps its buffers
  }
  Tensor total;
  for (int64_t i = 0; i < options.accumulation; ++i) {
    std::optional<dist::DistributedDataParallel::NoSync> local;
    if (ddp && i + 1 < options.accumulation) local.emplace(*ddp);  // reduce once, after the last
    Tensor loss;
    {
      const nvtx::Range range("forward");
      AutocastGuard autocast(options.device.type, options.amp.value_or(DType::bf16), options.amp.has_value());
      Fp8AutocastGuard fp8(options.device.type, options.fp8.value_or(Fp8Recipe()), options.fp8.has_value());
      loss = loss_fn(device_batches[static_cast<size_t>(i)]);
      MT_CHECK(loss.numel() == 1, "Trainer: the loss function must return one value, got shape ",
               shape_str(loss.shape()));
      loss = loss.reshape({});
      if (options.accumulation > 1) loss = mul(loss, weights[static_cast<size_t>(i)]);
    }
    {
      const nvtx::Range range("backward");
      scaler->scale(loss).backward();
    }
    total = total.defined() ? add(total, loss.detach()) : loss.detach();
  }
  const nvtx::Range range("optimizer");
  const double clip = options.optimizer.grad_clip;
  if (ddp && clip <= 0 && !fp16) {
    // No loss scaler, no clipping: nothing needs every gradient at once, so the update of the early
    // buckets can hide the last all-reduce.
    ddp->step(*optimizer);
  } else {
    if (ddp) ddp->synchronize();  // every rank now holds the average gradient
    // Unscaled before the update even without clipping, so that a logged gradient norm is the true one.
    if (clip > 0 || fp16) scaler->unscale_(*optimizer);
    if (clip > 0) grad_norm_out = clip_grad_norm_(params, clip);
    scaler->step(*optimizer);
    scaler->update();
  }
  loss_out.copy_(total.to(DType::f32).reshape({1}));
}

double Trainer::Impl::read_grad_norm() {
  if (options.optimizer.grad_clip > 0 && grad_norm_out.defined()) return grad_norm_out.item();
  // Without clipping the norm is taken on logged steps only; the gradients are still there
  // (a scaled f16 step's are unscaled by the scaler's step).
  return clip_grad_norm_(params, std::numeric_limits<double>::infinity()).item();
}

std::map<std::string, double> Trainer::Impl::checkpoint_extra(int64_t step) const {
  std::map<std::string, double> extra{{"step", static_cast<double>(step)}};
  for (const auto& [key, value] : data.state()) extra["data." + key] = value;
  return extra;
}

void Trainer::Impl::save_checkpoint(int64_t step) {
  if (!checkpoints) return;
  const auto start = std::chrono::steady_clock::now();
  TrainingState state{&model, optimizer.get(), scaler.get(), schedule.get(), checkpoint_extra(step)};
  if (is_main()) {
    const nvtx::Range range("checkpoint save");
    const std::string path = checkpoints->save(step, state);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    print(options.name + ": checkpoint " + path);
    if (seconds > 5) print(options.name + format(": the checkpoint took %.1f s to write", seconds));
    for (const auto& callback : save_callbacks) callback(step, path);
  }
  interval_excluded += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t Trainer::Impl::resume() {
  const std::optional<std::string> latest = checkpoints->latest();
  if (!latest) {
    print(options.name + ": no checkpoint in " + options.save_dir + "; starting from step 1");
    return 0;
  }
  TrainingState state{&model, optimizer.get(), scaler.get(), schedule.get(), {}};
  load_training_checkpoint(*latest, state);
  MT_CHECK_T(FileError, state.extra.count("step"), *latest, ": not a training checkpoint of this program (no 'step')");
  std::map<std::string, double> position;
  for (const auto& [key, value] : state.extra) {
    if (key.rfind("data.", 0) == 0) position[key.substr(5)] = value;
  }
  data.restore(position);
  const auto step = static_cast<int64_t>(state.extra.at("step"));
  print(options.name + ": resumed from " + *latest + " at step " + std::to_string(step));
  return step;
}

double Trainer::Impl::evaluate() {
  MT_CHECK(validation != nullptr, "Trainer::evaluate: no validation data (set_validation)");
  const nvtx::Range range("validation");
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  validation->restore(validation_start);
  // Validation measures the model as it trains, FP8 layers included. Its forwards would push their
  // amaxes into the delayed-scaling histories, making the training steps after it depend on how
  // often it runs: it moves copies of the states instead.
  std::optional<nn::Fp8StateRestoreGuard> training_fp8_states;
  if (options.fp8) training_fp8_states.emplace(model);
  ProgressBar progress(options.name + ": validation", options.eval_batches, progress_mode);
  double weighted = 0, counted = 0;
  for (int64_t i = 0; i < options.eval_batches; ++i) {
    Batch batch = validation->next();
    for (Tensor* t : {&batch.inputs, &batch.targets, &batch.positions, &batch.segments}) {
      if (t->defined()) *t = t->to(options.device);
    }
    AutocastGuard autocast(options.device.type, options.amp.value_or(DType::bf16), options.amp.has_value());
    Fp8AutocastGuard fp8(options.device.type, options.fp8.value_or(Fp8Recipe()), options.fp8.has_value());
    const double loss = loss_fn(batch).item();
    const double weight = batch.count > 0 ? static_cast<double>(batch.count) : 1.0;
    weighted += loss * weight;
    counted += weight;
    progress.update(i + 1, i + 1, {});
  }
  model.train(was_training);
  return global_mean(weighted / counted);
}

// fp8_overflows (since the last record), fp8_scale_min and fp8_scale_max over every rank's FP8
// states (delayed scaling's, or current scaling's latest casts); nothing before the first FP8 step.
void Trainer::Impl::record_fp8_health(Scalars& scalars) {
  const nn::Fp8Health health = nn::fp8_health(model);
  std::vector<double> sum = {static_cast<double>(health.overflows), static_cast<double>(health.states)};
  std::vector<double> max = {-health.min_scale, health.max_scale};
  if (world_size() > 1) {
    const Tensor s = from_vector(sum, {2}, DType::f64), m = from_vector(max, {2}, DType::f64);
    options.group->all_reduce_(s, dist::ReduceOp::sum);
    options.group->all_reduce_(m, dist::ReduceOp::max);
    sum = s.to_vector<double>();
    max = m.to_vector<double>();
  }
  if (sum[1] == 0) return;
  const auto total = static_cast<int64_t>(sum[0]);
  // A count below the last one means new states (a resume loads fresh ones): all of it is new.
  const int64_t since = total >= fp8_overflows_seen ? total - fp8_overflows_seen : total;
  fp8_overflows_seen = total;
  scalars.emplace_back("fp8_overflows", static_cast<double>(since));
  scalars.emplace_back("fp8_scale_min", -max[0]);
  scalars.emplace_back("fp8_scale_max", max[1]);
}

void Trainer::Impl::log_step(int64_t step, int64_t first_step, bool evaluated, double val_loss) {
  // The only read-backs of a step, on logged steps alone; figures over all ranks.
  const double loss = global_mean(loss_out.item());
  if (!std::isfinite(loss) && !fp16) {
    throw Error("Trainer: the loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                "; lower the learning rate or check the data");
  }
  const double grad_norm = read_grad_norm();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - interval_start).count() - interval_excluded;
  const double tokens_per_s = interval_targets / std::max(seconds, 1e-9);
  if (step == first_step) result.first_loss = loss;
  result.last_loss = loss;

  StepMetrics record{step, {}};
  Scalars& s = record.scalars;
  s.emplace_back("loss", loss);
  if (evaluated) s.emplace_back("val_loss", val_loss);
  s.emplace_back("lr", step_lr);
  s.emplace_back("grad_norm", grad_norm);
  s.emplace_back("tokens_per_s", tokens_per_s);
  s.emplace_back("step_ms", 1e3 * seconds / static_cast<double>(std::max<int64_t>(interval_steps, 1)));
  if (options.flops_per_token > 0 && peak_flops) {
    s.emplace_back("mfu", options.flops_per_token * tokens_per_s / *peak_flops);
  }
  if (fp16) {
    s.emplace_back("loss_scale", scaler->get_scale());
    s.emplace_back("skipped_steps", static_cast<double>(step - optimizer->steps_taken()));
  }
  if (options.device.is_cuda()) {
    const cuda::MemoryStats memory = cuda::memory_stats(options.device.index);
    s.emplace_back("mem_allocated_gib", static_cast<double>(memory.allocated) / kGiB);
    s.emplace_back("mem_reserved_gib", static_cast<double>(memory.reserved) / kGiB);
    s.emplace_back("mem_peak_gib", static_cast<double>(memory.peak_allocated) / kGiB);
  }
  if (options.fp8) record_fp8_health(s);
  interval_start = std::chrono::steady_clock::now();
  interval_excluded = 0;
  interval_steps = 0;
  interval_targets = 0;
  for (const auto& callback : step_callbacks) callback(record);
  if (!is_main()) return;
  if (metrics) metrics->log(step, unix_time(), s);

  std::vector<std::string> fields = {format("loss %.4f", loss), format("lr %.2e", step_lr),
                                     format("grad norm %.3f", grad_norm),
                                     with_commas(static_cast<int64_t>(tokens_per_s)) + " tok/s"};
  if (options.flops_per_token > 0 && peak_flops) {
    fields.push_back(format("MFU %.1f%%", 100.0 * record.value("mfu")));
  }
  // The loss scale as it is: after many skipped steps it falls below 1.
  fields.push_back(fp16 ? format("loss scale %g", record.value("loss_scale")) : std::string("loss scale off"));
  if (!std::isnan(record.value("fp8_overflows"))) {
    fields.push_back(
        fp8_field(record.value("fp8_overflows"), record.value("fp8_scale_min"), record.value("fp8_scale_max")));
  }
  // Peak allocated against reserved: the gap is what the caching allocator holds beyond the tensors (fragmentation).
  if (options.device.is_cuda()) {
    fields.push_back(format("mem %.2f GiB peak", record.value("mem_peak_gib")) +
                     format(", %.2f reserved", record.value("mem_reserved_gib")));
  }
  last_fields = fields;
  if (options.quiet) return;
  if (bar && bar->draws()) {
    bar->update(step, step - first_step + 1, fields);
  } else {
    const double elapsed = result.seconds;
    std::printf("%s\n",
                progress_line(options.name, step, options.steps, fields, elapsed, step - first_step + 1).c_str());
  }
}

// ------------------------------------------------------------------ Trainer

Trainer::Trainer(nn::Module& model, DataSource& train_data, LossFn loss, TrainerOptions options)
    : impl_(std::make_unique<Impl>(model, train_data, std::move(loss), std::move(options))) {}

Trainer::~Trainer() = default;

void Trainer::set_validation(DataSource& data) {
  impl_->validation = &data;
  impl_->validation_start = data.state();
}

void Trainer::on_step_end(std::function<void(const StepMetrics&)> callback) {
  impl_->step_callbacks.push_back(std::move(callback));
}
void Trainer::on_validation(std::function<void(int64_t, double)> callback) {
  impl_->validation_callbacks.push_back(std::move(callback));
}
void Trainer::on_save(std::function<void(int64_t, const std::string&)> callback) {
  impl_->save_callbacks.push_back(std::move(callback));
}

double Trainer::evaluate() { return impl_->evaluate(); }
AdamW& Trainer::optimizer() { return *impl_->optimizer; }
GradScaler& Trainer::scaler() { return *impl_->scaler; }
LRScheduler& Trainer::scheduler() { return *impl_->schedule; }
const TrainerOptions& Trainer::options() const { return impl_->options; }

TrainResult Trainer::fit() {
  Impl& t = *impl_;
  const TrainerOptions& o = t.options;
  t.result = TrainResult{};
  if (!o.save_dir.empty()) {
    t.checkpoints.emplace(o.save_dir, o.keep);
    install_stop_handlers();
  }
  int64_t first_step = 1;
  if (o.resume) first_step = t.resume() + 1;
  if (t.is_main() && (!o.metrics.jsonl_path.empty() || !o.metrics.tensorboard_dir.empty())) {
    t.metrics = std::make_unique<MetricsLogger>(o.metrics, first_step - 1);
  }
  t.print(o.name + ": " + t.data.describe() + (t.data.describe().empty() ? "" : ", ") + std::to_string(o.steps) +
          " steps of " + std::to_string(o.accumulation) + " micro-batch" + (o.accumulation > 1 ? "es" : "") + " on " +
          o.device.str() + (o.amp ? std::string(", ") + dtype_name(*o.amp) + " autocast" : std::string(", f32")) +
          (o.fp8 ? ", FP8 Linear layers (" + o.fp8->str() + ")" : std::string()) +
          (t.world_size() > 1 ? ", data parallel over " + std::to_string(t.world_size()) + " ranks" : std::string()));
  if (o.device.is_cuda()) cuda::reset_peak_memory(o.device.index);

  CudaGraphStep graph_step(
      o.device, [&t] { t.run_step(); }, {t.optimizer.get()}, /*warmup=*/2, o.cuda_graph);
  const AnomalyGuard anomaly(o.detect_anomaly);
  if (o.deterministic) backends::set_deterministic_algorithms(true);
  if (t.is_main() && !o.quiet) t.bar = std::make_unique<ProgressBar>(o.name, o.steps, t.progress_mode);
  t.model.train();
  t.run_start = t.interval_start = std::chrono::steady_clock::now();
  t.interval_excluded = 0;
  for (int64_t step = first_step; step <= o.steps; ++step) {
    t.profile_around(step, first_step, /*run_ended=*/false);
    t.load_micro_batches();
    graph_step.run();
    // A replayed step runs no host code: the loss scaler's limits are checked here instead.
    if (t.fp16 && graph_step.captured() && step % 100 == 0) t.scaler->check_limits();
    t.step_lr = t.schedule->last_lr();  // the rate this step used; step() sets the next one's
    t.schedule->step();
    ++t.interval_steps;
    t.interval_targets += static_cast<double>(t.step_targets * t.world_size());

    const bool last = step == o.steps;
    const bool evaluate = t.validation != nullptr && (last || (o.eval_every > 0 && step % o.eval_every == 0));
    double val_loss = 0;
    if (evaluate) {
      const auto start = std::chrono::steady_clock::now();
      val_loss = t.evaluate();
      t.interval_excluded += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      t.result.val_loss = val_loss;
      t.print(o.name + ": step " + std::to_string(step) + format(": validation loss %.4f", val_loss));
      for (const auto& callback : t.validation_callbacks) callback(step, val_loss);
    }
    if (step == first_step || step % o.log_every == 0 || last || evaluate) {
      t.log_step(step, first_step, evaluate, val_loss);
    } else if (t.bar && t.bar->draws()) {
      t.bar->update(step, step - first_step + 1, t.last_fields);
    }
    t.result.last_step = step;

    const std::string stop = t.checkpoints ? stop_reason(step, o.stop_at, o.group) : std::string();
    if (t.checkpoints && (!stop.empty() || last || (o.save_every > 0 && step % o.save_every == 0))) {
      t.save_checkpoint(step);
    }
    if (!stop.empty()) {
      t.print(o.name + ": stopped after step " + std::to_string(step) + " (" + stop + ")");
      t.result.interrupted = true;
      break;
    }
  }
  if (t.bar) t.bar->close();
  t.bar.reset();
  if (o.report) {
    t.profile_around(t.result.last_step + 1, first_step, /*run_ended=*/true);  // a run shorter than the window
    if (t.result.report.empty()) t.result.report = "(the run ended before a step could be profiled)";
    t.print(o.name + ": report\n" + t.result.report);
  }
  t.result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t.run_start).count();
  return t.result;
}

}  // namespace mt::train
