// A multi-layer perceptron learns to classify points of a three-armed spiral.
//
//   build/examples/mlp --device cuda --amp fp16
//
// The training loop is what a user writes, as with PyTorch's AMP: forward and
// loss under autocast, the loss scaled, backward, scaler step, scaler update,
// learning-rate schedule. Under mpirun it trains data-parallel with no other change:
// each rank takes every world-th point (all three arms), gradients are averaged by
// DistributedDataParallel, rank 0 prints the loss averaged over the ranks.
//
//   mpirun -np 2 build/examples/mlp --device cuda     # one GPU per rank
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/ddp.h"
#include "examples/common/cli.h"
#include "ops/loss/loss.h"
#include "ops/matmul/matmul.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "optim/training_checkpoint.h"

namespace {

struct Dataset {
  mt::Tensor points;  // [N, 2]
  mt::Tensor labels;  // [N] i64
};

// Three interleaved spiral arms with a little noise: not linearly separable.
Dataset make_spirals(int64_t per_class, uint64_t seed) {
  constexpr int kClasses = 3;
  mt::Generator gen(seed);
  const std::vector<double> noise = mt::randn({per_class * kClasses * 2}, mt::DType::f64, &gen).to_vector<double>();
  std::vector<double> xy;
  std::vector<double> labels;
  for (int c = 0; c < kClasses; ++c) {
    for (int64_t i = 0; i < per_class; ++i) {
      const double r = static_cast<double>(i) / static_cast<double>(per_class);  // radius in [0, 1)
      const double theta = 4.0 * r + 2.0 * M_PI * c / kClasses;
      const size_t k = static_cast<size_t>(2 * (c * per_class + i));
      xy.push_back(r * std::sin(theta) + 0.02 * noise[k]);
      xy.push_back(r * std::cos(theta) + 0.02 * noise[k + 1]);
      labels.push_back(c);
    }
  }
  const int64_t n = per_class * kClasses;
  return {mt::from_vector(xy, {n, 2}), mt::from_vector(labels, {n}, mt::DType::i64)};
}

// 2 -> hidden -> hidden -> 3 with ReLUs; each layer initialised like torch.nn.Linear
// (uniform +-1/sqrt(in)). A Module, so that data parallelism can find its parameters.
class SpiralMlp : public mt::nn::Module {
 public:
  SpiralMlp(int64_t hidden, mt::Device device, mt::Generator& gen) {
    add_layer("fc1", 2, hidden, device, gen);
    add_layer("fc2", hidden, hidden, device, gen);
    add_layer("fc3", hidden, 3, device, gen);
  }
  mt::Tensor forward(const mt::Tensor& x) const {
    mt::Tensor h = mt::relu(mt::linear(x, weights_[0], biases_[0]));
    h = mt::relu(mt::linear(h, weights_[1], biases_[1]));
    return mt::linear(h, weights_[2], biases_[2]);  // [N, 3] logits
  }

 private:
  void add_layer(const std::string& name, int64_t in, int64_t out, mt::Device device, mt::Generator& gen) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    const mt::TensorOptions options = mt::TensorOptions().device(device);
    weights_.push_back(register_parameter(name + "_weight", mt::uniform({out, in}, -bound, bound, options, &gen)));
    biases_.push_back(register_parameter(name + "_bias", mt::uniform({out}, -bound, bound, options, &gen)));
  }
  std::vector<mt::Tensor> weights_, biases_;
};

double accuracy(const mt::Tensor& logits, const std::vector<int64_t>& labels) {
  const std::vector<float> values = logits.to_vector<float>();
  const int64_t classes = logits.size(1);
  int64_t correct = 0;
  for (size_t row = 0; row < labels.size(); ++row) {
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (values[row * classes + c] > values[row * classes + best]) best = c;
    }
    correct += best == labels[row];
  }
  return static_cast<double>(correct) / static_cast<double>(labels.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP on a synthetic three-class spiral"};
  example::setup(app, "mlp");
  example::PlacementFlags placement_flags;
  example::CheckpointFlags checkpoint_flags;
  int64_t steps = 1500;
  int64_t hidden = 64;
  int64_t per_class = 300;
  double lr = 0.01;
  double momentum = 0.9;
  std::string optimizer_name = "adamw";
  uint64_t seed = example::kDefaultSeed;
  int64_t log_every = 100;
  double min_accuracy = 0.0;
  placement_flags.add_to(app);
  app.add_option("--steps", steps, "training steps (full batch)")->capture_default_str()->check(example::positive());
  app.add_option("--hidden", hidden, "hidden width")->capture_default_str()->check(example::positive());
  app.add_option("--points-per-class", per_class, "points per spiral arm")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--lr", lr, "peak learning rate")->capture_default_str()->check(example::positive());
  app.add_option("--momentum", momentum, "SGD momentum")->capture_default_str()->check(example::range(0.0, 0.999));
  app.add_option("--optimizer", optimizer_name, "adamw or sgd")
      ->capture_default_str()
      ->check(example::one_of({"adamw", "sgd"}));
  example::add_seed(app, seed, "the data and the initialisation");
  app.add_option("--log-every", log_every, "steps between progress lines")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--min-accuracy", min_accuracy, "exit with status 1 if the final accuracy is lower")
      ->capture_default_str()
      ->check(example::range(0.0, 1.0));
  checkpoint_flags.add_to(app);
  CLI11_PARSE(app, argc, argv);

  try {
    // Under mpirun: one process per rank, each on its own GPU (by local rank) when on CUDA.
    const example::Placement placement = placement_flags.resolve();
    const mt::Device device = placement.device;
    mt::dist::ProcessGroup* group = placement.group;
    const int rank = placement.rank(), world = placement.world_size();
    if (rank != 0) std::freopen("/dev/null", "w", stdout);  // rank 0 reports

    mt::manual_seed(seed);
    mt::Generator gen(seed);
    const Dataset data = make_spirals(per_class, seed);
    const std::vector<int64_t> labels = data.labels.to_vector<int64_t>();
    const mt::Tensor x = data.points.to(device);
    const mt::Tensor y = data.labels.to(device);
    // This rank's share: every world-th point.
    const mt::Tensor x_shard = x.slice(0, rank, x.size(0), world), y_shard = y.slice(0, rank, y.size(0), world);
    const std::vector<int64_t> shard_labels = y_shard.to_vector<int64_t>();

    SpiralMlp model(hidden, device, gen);
    std::unique_ptr<mt::dist::DistributedDataParallel> ddp;
    if (group) ddp = std::make_unique<mt::dist::DistributedDataParallel>(model, *group);
    const std::vector<mt::Tensor> params = model.parameters();
    std::unique_ptr<mt::Optimizer> optimizer;
    if (optimizer_name == "adamw") {
      optimizer = std::make_unique<mt::AdamW>(params, mt::AdamWOptions(lr).weight_decay(1e-4));
    } else {
      optimizer = std::make_unique<mt::SGD>(params, mt::SGDOptions(lr).momentum(momentum));
    }
    mt::WarmupCosineLR schedule(*optimizer, /*warmup_steps=*/std::min<int64_t>(100, steps / 10), /*total_steps=*/steps);
    // Loss scaling matters for f16 (5 exponent bits); bf16 has f32's range and needs none.
    const bool fp16 = placement.amp == mt::DType::f16;
    mt::GradScaler scaler(device, mt::GradScalerOptions().enabled(fp16));
    auto forward = [&](const mt::Tensor& input) { return model.forward(input); };

    std::printf("mlp: %lld points, 3 classes, 2-%lld-%lld-3 MLP on %s, %s lr %.3g (warmup + cosine)\n",
                static_cast<long long>(x.size(0)), static_cast<long long>(hidden), static_cast<long long>(hidden),
                placement.describe().c_str(), optimizer_name.c_str(), lr);
    if (group) {
      std::printf("mlp: data parallel over %d ranks, %lld points each\n", world,
                  static_cast<long long>(x_shard.size(0)));
    }
    // Training checkpoints: rank 0 writes, every rank resumes from the same file.
    std::optional<mt::CheckpointDirectory> checkpoints = checkpoint_flags.open();
    mt::TrainingState state{&model, optimizer.get(), &scaler, &schedule, {}};
    int64_t first_step = 1;
    if (checkpoint_flags.resume) {
      if (const std::optional<std::string> latest = checkpoints->latest()) {
        mt::load_training_checkpoint(*latest, state);
        MT_CHECK_T(mt::FileError, state.extra.count("step"), *latest, ": not an mlp checkpoint (no 'step')");
        first_step = static_cast<int64_t>(state.extra.at("step")) + 1;
        std::printf("mlp: resumed from %s at step %lld\n", latest->c_str(), static_cast<long long>(first_step - 1));
      } else {
        std::printf("mlp: no checkpoint in %s; starting from step 1\n", checkpoint_flags.save_dir.c_str());
      }
    }
    auto save = [&](int64_t step) {
      state.extra["step"] = static_cast<double>(step);
      if (rank == 0) std::printf("mlp: checkpoint %s\n", checkpoints->save(step, state).c_str());
    };

    const auto start = std::chrono::steady_clock::now();
    double acc = 0.0;
    for (int64_t step = first_step; step <= steps; ++step) {
      mt::Tensor logits, loss;
      {
        mt::AutocastGuard amp_region(device.type, placement.amp.value_or(mt::DType::bf16), placement.amp.has_value());
        logits = forward(x_shard);
        loss = mt::cross_entropy(logits, y_shard);  // f32 under autocast
      }
      if (ddp) {
        ddp->zero_grad();
      } else {
        optimizer->zero_grad();
      }
      scaler.scale(loss).backward();
      if (ddp) ddp->synchronize();  // the gradients, averaged over the ranks
      scaler.step(*optimizer);
      scaler.update();
      const double lr_used = schedule.last_lr();
      schedule.step();
      if (step % log_every == 0 || step == steps) {
        // Reading values waits for the device: only when logging. Every rank logs on the same steps.
        acc = accuracy(logits, shard_labels);
        const double mean_loss = group ? group->mean_over_ranks(loss.item()) : loss.item();
        if (group) acc = group->mean_over_ranks(acc);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const int64_t steps_run = step - first_step + 1;
        const std::vector<std::string> fields = {
            example::format("loss %.4f", mean_loss), example::format("accuracy %5.1f%%", 100.0 * acc),
            example::format("lr %.2e", lr_used),
            "loss scale " + example::loss_scale_text(fp16 ? std::optional<double>(scaler.get_scale()) : std::nullopt),
            example::format("%.3f ms/step", 1000.0 * seconds / static_cast<double>(steps_run))};
        std::printf("%s\n", example::progress_line("mlp", step, steps, fields, seconds, steps_run).c_str());
      }
      if (checkpoints) {
        const std::string stop = example::stop_reason(step, checkpoint_flags, group);
        if (!stop.empty() || checkpoint_flags.due(step, steps)) save(step);
        if (!stop.empty()) {
          std::printf("mlp: stopped after step %lld (%s)\n", static_cast<long long>(step), stop.c_str());
          return 0;
        }
      }
    }
    {
      mt::NoGradGuard no_grad;
      acc = accuracy(forward(x), labels);
    }
    std::printf("mlp: final accuracy %.1f%%\n", 100.0 * acc);
    if (acc < min_accuracy) {
      std::fprintf(stderr, "mlp: accuracy %.1f%% is below --min-accuracy %.1f%%\n", 100.0 * acc, 100.0 * min_accuracy);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp: %s\n", e.what());
    return 2;
  }
  return 0;
}
