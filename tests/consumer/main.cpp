// Built against an installed mixtrain: proves the exported package works, the Trainer included.
// A linear model learns y = 2x - 1 through mt::train::Trainer; the loss must fall 20-fold.
#include <cstdio>

#include "core/random.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "train/trainer.h"

int main() {
  mt::manual_seed(0);
  mt::nn::Linear model(mt::nn::LinearOptions(1, 1));
  mt::Generator rng(1);
  mt::train::FunctionData data([&] {
    const mt::Tensor x = mt::randn({64, 1}, {}, &rng);
    return mt::train::Batch{x, x * 2.0 - 1.0, /*count=*/64};
  });
  mt::train::TrainerOptions options;
  options.name = "consumer";
  options.steps = 200;
  options.log_every = 50;
  options.progress = mt::train::ProgressMode::lines;
  options.optimizer.lr = 0.05;
  options.optimizer.weight_decay = 0.0;
  auto loss = [&](const mt::train::Batch& b) { return mt::mean(mt::pow(model.forward(b.inputs) - b.targets, 2.0)); };
  mt::train::Trainer trainer(model, data, loss, options);
  const mt::train::TrainResult result = trainer.fit();
  std::printf("consumer: loss %.5f -> %.5f\n", result.first_loss, result.last_loss);
  return result.last_loss * 20 < result.first_loss ? 0 : 1;
}
