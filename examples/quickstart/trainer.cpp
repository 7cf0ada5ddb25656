// A user's own model trained through mt::train::Trainer: f16 autocast with loss scaling on a GPU
// (f32 on the CPU), AdamW with warm-up and cosine decay, progress, a metrics file, checkpoints,
// and a resume from the newest checkpoint when run again.
//
//   build/examples/quickstart_trainer trainer-run/     # run it twice: the second run resumes
#include <cstdio>

#include "core/cuda_context.h"
#include "ops/ops.h"
#include "train/trainer.h"

struct Net : mt::nn::Module {
  Net() {
    register_module("fc1", fc1, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(16, 64)));
    register_module("fc2", fc2, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(64, 1)));
  }
  mt::Tensor forward(const mt::Tensor& x) const { return fc2->forward(mt::gelu(fc1->forward(x))); }
  std::shared_ptr<mt::nn::Linear> fc1, fc2;
};

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "trainer-run";
  mt::manual_seed(0);
  Net model;
  mt::Generator data_rng(1);
  mt::train::FunctionData data([&] {  // each step a fresh batch of y = tanh(sum(x))
    const mt::Tensor x = mt::randn({256, 16}, {}, &data_rng);
    return mt::train::Batch{x, mt::tanh(mt::sum(x, {1}, /*keepdim=*/true)), /*count=*/256};
  });
  mt::train::TrainerOptions options;
  options.name = "quickstart_trainer";
  options.steps = 400;
  options.log_every = 100;
  options.optimizer.lr = 1e-2;
  options.optimizer.warmup = 20;
  options.optimizer.weight_decay = 0.01;
  options.device = mt::cuda::is_available() ? mt::cuda_device(0) : mt::Device("cpu");
  if (options.device.is_cuda()) options.amp = mt::DType::f16;
  options.save_dir = dir;  // checkpoints every 100 steps, at the end, and on SIGTERM or Ctrl-C
  options.save_every = 100;
  options.resume = true;
  options.metrics.jsonl_path = dir + "/metrics.jsonl";
  model.to(options.device);
  auto loss = [&](const mt::train::Batch& b) { return mt::mean(mt::pow(model.forward(b.inputs) - b.targets, 2.0)); };
  mt::train::Trainer trainer(model, data, loss, options);
  const mt::train::TrainResult result = trainer.fit();
  std::printf("loss %.5f -> %.5f\n", result.first_loss, result.last_loss);
  model.save(dir + "/model.safetensors");
}
