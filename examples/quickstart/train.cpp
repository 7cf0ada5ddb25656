// A complete mixed-precision training loop: a small MLP fits y = tanh(sum(x)) under f16
// autocast with dynamic loss scaling and AdamW, checkpoints as it trains, resumes from the
// newest checkpoint when run again, and saves the trained model as safetensors.
//
//   build/examples/quickstart quickstart-run/     # run it twice: the second run resumes
#include <cstdio>
#include <memory>
#include <string>

#include "core/cuda_context.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/training_checkpoint.h"

struct Net : mt::nn::Module {
  Net() {
    register_module("fc1", fc1, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(16, 64)));
    register_module("fc2", fc2, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(64, 1)));
  }
  mt::Tensor forward(const mt::Tensor& x) const { return fc2->forward(mt::gelu(fc1->forward(x))); }
  std::shared_ptr<mt::nn::Linear> fc1, fc2;
};

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "quickstart-run";
  const mt::Device device = mt::cuda::is_available() ? mt::cuda_device(0) : mt::Device("cpu");
  mt::manual_seed(0);
  const mt::Tensor x = mt::randn({512, 16}, device);                 // [N, 16]
  const mt::Tensor y = mt::tanh(mt::sum(x, {1}, /*keepdim=*/true));  // [N, 1]

  Net model;
  model.to(device);
  mt::AdamW opt(model.parameters(), mt::AdamWOptions(3e-3).weight_decay(0.01));
  mt::GradScaler scaler(device);  // loss scaling for f16; bf16 would need none
  mt::CheckpointDirectory checkpoints(dir, /*keep=*/2);
  mt::TrainingState state{&model, &opt, &scaler, /*scheduler=*/nullptr, {}};
  int64_t first_step = 1;
  if (const auto latest = checkpoints.latest()) {  // resume exactly where the last run stopped
    mt::load_training_checkpoint(*latest, state);
    first_step = static_cast<int64_t>(state.extra.at("step")) + 1;
    std::printf("resumed from %s\n", latest->c_str());
  }

  for (int64_t step = first_step; step <= 400; ++step) {
    mt::Tensor loss;
    {
      mt::AutocastGuard amp(device.type, mt::DType::f16);  // GEMMs in f16, the mean in f32
      loss = mt::mean(mt::pow(model.forward(x) - y, 2.0));
    }
    opt.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(opt);  // skipped when a gradient overflowed
    scaler.update();
    if (step % 100 == 0) {
      std::printf("step %3lld  loss %.5f  scale %g\n", static_cast<long long>(step), loss.item(), scaler.get_scale());
      state.extra["step"] = static_cast<double>(step);
      checkpoints.save(step, state);
    }
  }
  model.save(dir + "/model.safetensors");  // the state_dict: fc1.weight, fc1.bias, ...
  std::printf("saved %s/model.safetensors\n", dir.c_str());
}
