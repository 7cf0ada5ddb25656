// The mixtrain side of tools/parity/loss_curve.py: trains a Hugging Face causal LM directory
// (any model_type mt::nn::load_causal_lm reads: gpt2, llama, mistral, qwen2) on given batches
// with AdamW and prints the loss of every step, so that a PyTorch run from the same weights on
// the same batches can be compared step by step.
//
//   train_steps --model hf_dir --batches batches.safetensors [--device cuda] [--amp bf16]
//               [--lr 6e-4 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1]
//               [--schedule warmup-cosine --warmup 10 --clip 1.0]
//
// batches.safetensors holds "ids" [steps, B, T + 1] (I64): step s trains on inputs
// ids[s, :, :T] and targets ids[s, :, 1:]. Every parameter is decayed (no groups), so that
// both sides run the same update. The learning rate is constant (--schedule constant) or
// warms up linearly over --warmup steps and then follows a half cosine to 0 at the last step
// (mt::WarmupCosineLR, as transformers' get_cosine_schedule_with_warmup: step 0 has lr 0).
// --clip > 0 clips the gradients' global norm before each step (mt::clip_grad_norm_).
// Each step prints "step S loss L" with L to 9 significant digits.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <vector>

#include "core/cuda_context.h"
#include "core/safetensors.h"
#include "examples/common/cli.h"
#include "ops/nn/causal_lm.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"

namespace {

// The "ids" tensor of the batch file, checked: [steps, B, T + 1] integer ids below vocab.
mt::Tensor load_batches(const std::string& path, int64_t vocab_size, int64_t n_positions) {
  const mt::SafetensorsFile file = mt::load_safetensors(path);
  const auto it = file.tensors.find("ids");
  MT_CHECK(it != file.tensors.end(), path, ": no tensor named \"ids\"");
  const mt::Tensor ids = it->second.to(mt::DType::i64);
  MT_CHECK(ids.dim() == 3 && ids.size(2) >= 2, path, ": \"ids\" must be [steps, B, T + 1] with T >= 1, got ",
           mt::shape_str(ids.shape()));
  MT_CHECK(ids.size(2) - 1 <= n_positions, path, ": sequences of ", ids.size(2) - 1,
           " tokens are longer than the model's context, ", n_positions);
  const std::vector<int64_t> values = ids.to_vector<int64_t>();
  for (size_t i = 0; i < values.size(); ++i) {
    MT_CHECK(values[i] >= 0 && values[i] < vocab_size, path, ": id ", values[i], " at flat index ", i,
             " is outside the vocabulary [0, ", vocab_size, ")");
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a Hugging Face causal LM checkpoint on given batches and print every step's loss"};
  example::setup(app, "train_steps");
  std::string model_dir, batches_path, device_name = "cpu", amp = "off";
  double lr = 6e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 0;
  std::string schedule = "constant";
  int64_t warmup = 0;
  app.add_option("--model", model_dir, "HF model directory: gpt2, llama, mistral or qwen2 (dropout 0)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--batches", batches_path, "safetensors file with \"ids\" [steps, B, T + 1] I64")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str();
  app.add_option("--amp", amp, "autocast: off, bf16 or fp16 (fp16 without a loss scaler)")
      ->capture_default_str()
      ->check(example::one_of({"off", "bf16", "fp16"}));
  app.add_option("--lr", lr, "learning rate (the peak of warmup-cosine)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--beta1", beta1, "AdamW beta1")->capture_default_str()->check(example::range(0.0, 0.999999));
  app.add_option("--beta2", beta2, "AdamW beta2")->capture_default_str()->check(example::range(0.0, 0.999999));
  app.add_option("--eps", eps, "AdamW epsilon")->capture_default_str()->check(example::positive());
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay, on every parameter")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--schedule", schedule, "constant, or warmup-cosine (linear warm-up, then a half cosine to 0)")
      ->capture_default_str()
      ->check(example::one_of({"constant", "warmup-cosine"}));
  app.add_option("--warmup", warmup, "warm-up steps of warmup-cosine")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--clip", clip, "largest global gradient norm (0: no clipping)")
      ->capture_default_str()
      ->check(example::non_negative());
  CLI11_PARSE(app, argc, argv);
  if (schedule == "constant" && warmup > 0) {
    std::fprintf(stderr, "train_steps: --warmup %lld needs --schedule warmup-cosine\n", static_cast<long long>(warmup));
    return 2;
  }

  try {
    const mt::Device device(device_name);
    if (device.is_cuda()) mt::cuda::set_current_device(device.index);
    const std::shared_ptr<mt::nn::CausalLM> model = mt::nn::load_causal_lm(model_dir);
    MT_CHECK(model->dropout() == 0, model_dir, ": dropout is ", model->dropout(),
             "; a step-by-step comparison needs 0 (GPT-2: resid_pdrop, embd_pdrop, attn_pdrop)");
    model->to(device);
    model->train();
    const mt::Tensor batches = load_batches(batches_path, model->vocab_size(), model->max_positions());
    const int64_t steps = batches.size(0), seq = batches.size(2) - 1;
    const std::vector<mt::Tensor> params = model->trainable_parameters();
    const bool autocast = amp != "off";
    const mt::DType low = amp == "fp16" ? mt::DType::f16 : mt::DType::bf16;
    // As mt::Trainer trains: under autocast AdamW writes the weights' low-precision copies.
    mt::AdamWOptions adamw = mt::AdamWOptions(lr).betas(beta1, beta2).eps(eps).weight_decay(weight_decay);
    if (autocast) adamw.autocast_copies(low);
    mt::AdamW optimizer(params, adamw);
    MT_CHECK(schedule == "constant" || warmup < steps, "--warmup ", warmup, " must be below the ", steps, " steps of ",
             batches_path);
    std::unique_ptr<mt::WarmupCosineLR> scheduler;
    if (schedule == "warmup-cosine") scheduler = std::make_unique<mt::WarmupCosineLR>(optimizer, warmup, steps);
    std::printf("train_steps: %s, %lld steps of B=%lld T=%lld on %s, amp %s, lr %g (%s, warm-up %lld), clip %g\n",
                model->model_type().c_str(), static_cast<long long>(steps), static_cast<long long>(batches.size(1)),
                static_cast<long long>(seq), device.str().c_str(), amp.c_str(), lr, schedule.c_str(),
                static_cast<long long>(warmup), clip);
    for (int64_t step = 0; step < steps; ++step) {
      const mt::Tensor ids = batches.narrow(0, step, 1).squeeze(0).to(device);
      mt::Tensor loss;
      {
        mt::AutocastGuard guard(device.type, low, autocast);
        loss = model->loss(ids.slice(1, 0, seq), ids.slice(1, 1, seq + 1));
      }
      optimizer.zero_grad();
      loss.backward();
      if (clip > 0) mt::clip_grad_norm_(params, clip);
      optimizer.step();
      if (scheduler) scheduler->step();
      std::printf("step %lld loss %.9g\n", static_cast<long long>(step), loss.item());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_steps: %s\n", e.what());
    return 2;
  }
  return 0;
}
