// One Llama training step, timed and measured, per gradient-checkpointing mode: peak memory (the
// allocator's high-water mark) and the median step time. PyTorch's twin is llama_step_torch.py.
//
//   llama_step --shape smollm2-135m --lora-r 0 --batch 8 --seq-len 2048
//   llama_step --shape llama-3.2-1b --lora-r 16 --checkpoint off,blocks
//   llama_step --config path/config.json --device cpu --batch 2 --seq-len 16
//
// The model has a released model's shape (bench::llama_shape: smollm2-135m, llama-3.2-1b) or a
// config.json's, with random weights (N(0, 0.02)) in f32 and bf16 autocast on a GPU; AdamW writes
// the bf16 copies of the weights it updates (autocast_copies), as gpt_step does. --lora-r R > 0
// trains LoRA adapters of rank R, alpha 2R, on all seven projections (q, k, v, o, gate, up, down)
// and freezes the rest; autocast then casts the frozen f32 base once and keeps its bf16 copies
// (Note [Autocast cast cache]), or with --base-dtype bf16 the base is held in bf16 (the adapters
// stay f32), as llama_step_torch.py holds PEFT's; with --base-dtype fp8 the seven projections'
// weights are cast from bf16 to E4M3 with a scale per output channel and their forward and
// input-gradient GEMMs run in FP8 (Note [FP8 frozen base]; the embedding, norms and head stay bf16).
// The header line gives the bytes of the model's weights. The data are random token ids. A checkpointing
// mode the model lacks, or one that runs out of memory, is reported in its row and the next mode
// runs.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "autograd/profiler.h"
#include "core/cuda_context.h"
#include "examples/common/cli.h"
#include "examples/lm/trainer.h"
#include "ops/nn/fp8_base.h"
#include "ops/nn/llama.h"
#include "ops/nn/lora.h"
#include "ops/nn/parameter_init.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "tools/bench/bench_common.h"
#include "train/memory_plan.h"

int main(int argc, char** argv) {
  CLI::App app{"Time a Llama training step and measure its peak memory per checkpointing mode"};
  example::setup(app, "llama_step");
  example::PlacementFlags placement_flags;
  placement_flags.add_to(app);
  std::string shape = "smollm2-135m", config_path, modes = "off,blocks", base_dtype = "f32";
  int64_t batch = 8, seq = 2048, accumulate = 1, warmup = 3, steps = 10, lora_r = 0, profile_steps = 0;
  app.add_option("--shape", shape, "a released model's shape")
      ->capture_default_str()
      ->check(example::one_of({"smollm2-135m", "llama-3.2-1b", "llama-2-7b", "llama-3-8b", "llama-2-13b"}));
  app.add_option("--config", config_path, "a Hugging Face config.json to take the shape from instead of --shape")
      ->check(CLI::ExistingFile);
  app.add_option("--batch", batch, "sequences per step")->capture_default_str()->check(example::positive());
  app.add_option("--seq-len", seq, "tokens per sequence")->capture_default_str()->check(example::positive());
  app.add_option("--accumulate", accumulate,
                 "micro-batches of --batch sequences per optimizer step (step time and tokens/s are per step)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--lora-r", lora_r, "LoRA rank on the seven projections, alpha 2r (0: train every parameter)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--base-dtype", base_dtype,
                 "with --lora-r: the frozen base's dtype (the adapters are f32); fp8: the projections in E4M3 with a "
                 "scale per output channel, their GEMMs in FP8")
      ->capture_default_str()
      ->check(example::one_of({"f32", "bf16", "fp8"}));
  app.add_option("--checkpoint", modes, "comma-separated checkpointing modes to measure (off, blocks, ...)")
      ->capture_default_str();
  std::string max_memory;
  app.add_option("--max-memory", max_memory,
                 "also measure the checkpointing mode mt::train::plan_checkpointing picks for this budget (e.g. "
                 "21GiB)");
  app.add_option("--warmup", warmup, "untimed steps per mode")->capture_default_str()->check(example::non_negative());
  app.add_option("--steps", steps, "timed steps per mode")->capture_default_str()->check(example::positive());
  app.add_option("--profile", profile_steps, "after timing, profile this many steps per mode, op by op (0: none)")
      ->capture_default_str()
      ->check(example::non_negative());
  CLI11_PARSE(app, argc, argv);

  try {
    const example::Placement placement = placement_flags.resolve();
    MT_CHECK(placement.world_size() == 1, "llama_step runs in one process, not under mpirun");
    const mt::Device device = placement.device;
    MT_CHECK(lora_r > 0 || base_dtype == "f32", "--base-dtype ", base_dtype,
             " is for LoRA (--lora-r > 0): full training keeps f32 weights",
             base_dtype == "fp8" ? " (an FP8 base is frozen; FP8 training of every weight is Fp8AutocastGuard's)" : "");
    MT_CHECK(base_dtype == "f32" || placement.amp.has_value(), "--base-dtype ", base_dtype,
             " runs under autocast (--amp bf16 or fp16), as llama_step_torch.py's LoRA does");
    const mt::nn::LlamaConfig config = bench::llama_config(shape, config_path);
    MT_CHECK(seq <= config.max_position_embeddings, "--seq-len ", seq, " is longer than the model's ",
             config.max_position_embeddings, " positions (max_position_embeddings)");
    mt::Generator init(0);
    // Drawn where it trains and in its dtype (an FP8 base is cast from bf16, as from a bf16
    // checkpoint): a 13B model drawn in f32 on the host would be 52 GB there.
    const mt::DType weights = lora_r > 0 && base_dtype != "f32" ? mt::DType::bf16 : mt::DType::f32;
    std::shared_ptr<mt::nn::Llama> built;
    {
      mt::nn::ParameterInitGuard on_device(mt::nn::ParameterInit{mt::TensorOptions(weights).device(device)});
      built = std::make_shared<mt::nn::Llama>(config, &init);
    }
    mt::nn::Llama& model = *built;
    std::string training = "full training";
    if (lora_r > 0) {
      mt::nn::LoRAOptions lora;
      lora.r = lora_r;
      lora.alpha = 2.0 * static_cast<double>(lora_r);
      lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
      mt::nn::apply_lora(model, lora, &init);
      if (base_dtype == "fp8") mt::nn::quantize_linears_fp8(model);
      const std::string base = base_dtype == "bf16" ? "frozen base bf16, adapters f32"
                               : base_dtype == "fp8"
                                   ? "frozen base fp8 (E4M3, a scale per output channel; embedding and head bf16), "
                                     "adapters f32"
                               : placement.amp.has_value() ? "frozen base f32, cast once to bf16 copies"
                                                           : "frozen base f32";
      training = example::format("LoRA r=%lld alpha=%lld on q,k,v,o,gate,up,down_proj (%s)",
                                 static_cast<long long>(lora_r), static_cast<long long>(2 * lora_r), base.c_str());
    }
    if (device.is_cuda()) mt::cuda::empty_cache(device.index);  // the draws' f32 temporaries
    mt::nn::name_modules_for_tracing(model, "llama");           // after apply_lora: its layers take their paths too
    const std::string amp = !placement.amp ? "off" : *placement.amp == mt::DType::f16 ? "fp16" : "bf16";
    std::printf("llama_step: %s, B=%lld T=%lld x%lld micro-batches per step, %s, amp %s, %s; %s; weights %.2f GiB\n",
                bench::llama_description(shape, config_path, config).c_str(), static_cast<long long>(batch),
                static_cast<long long>(seq), static_cast<long long>(accumulate), device.str().c_str(), amp.c_str(),
                training.c_str(), mt::nn::trainable_parameters_summary(model).c_str(),
                static_cast<double>(mt::nn::weight_bytes(model)) / (1 << 30));

    mt::Generator data(1);
    const mt::Tensor ids =
        mt::uniform({accumulate * batch, seq + 1}, 0, static_cast<double>(config.vocab_size), {}, &data)
            .to(mt::DType::i64)
            .to(device);
    const mt::Tensor x = ids.slice(1, 0, seq), y = ids.slice(1, 1, seq + 1);  // [accumulate * B, T] each
    const bool autocast = placement.amp.has_value();
    const mt::DType low = placement.amp.value_or(mt::DType::bf16);

    mt::train::TrainingShape planned;  // the memory plan's view of this run, printed under each row
    planned.batch = batch;
    planned.seq_len = seq;
    planned.lora_r = lora_r;
    planned.base_dtype = lora_r > 0 ? base_dtype : "f32";
    std::vector<std::string> mode_list = lm_example::split_commas(modes);
    if (!max_memory.empty()) {
      const mt::train::MemoryEstimate plan =
          mt::train::plan_checkpointing(config, planned, mt::train::parse_memory_size(max_memory));
      std::printf("llama_step: the plan for %s: checkpointing %s\n", max_memory.c_str(), plan.checkpointing.c_str());
      mode_list.push_back(plan.checkpointing);
    }
    bench::StepTable table(device);
    table.print_header();
    for (const std::string& mode : mode_list) {
      try {
        model.set_checkpointing(mode);
      } catch (const mt::Error& e) {
        table.print_failure(mode, e.what());
        continue;
      }
      try {
        mt::AdamWOptions adamw(1e-4);
        if (autocast) adamw.autocast_copies(low);
        mt::AdamW opt(model.trainable_parameters(), adamw);
        mt::Tensor last_loss;
        // Every token is real, so each micro-batch's mean loss over `accumulate` is the whole batch's mean.
        auto train_step = [&] {
          mt::Tensor mean_loss;  // over the micro-batches: the step's loss
          opt.zero_grad(/*set_to_none=*/true);
          for (int64_t micro = 0; micro < accumulate; ++micro) {
            mt::Tensor loss;
            {
              mt::AutocastGuard guard(device.type, low, autocast);
              loss = model.loss(x.slice(0, micro * batch, (micro + 1) * batch),
                                y.slice(0, micro * batch, (micro + 1) * batch));
            }
            const mt::Tensor share = mt::mul(loss, 1.0 / static_cast<double>(accumulate));
            share.backward();
            mean_loss = mean_loss.defined() ? mt::add(mean_loss, share.detach()) : share.detach();
          }
          opt.step();
          return mean_loss;
        };
        const std::vector<double> times = bench::time_steps(device, warmup, steps, [&](int64_t step) {
          const mt::Tensor loss = train_step();
          if (step == warmup + steps - 1) last_loss = loss;
        });
        table.print_row(mode, 1e3 * bench::median(times), static_cast<double>(accumulate * batch * seq),
                        last_loss.to(mt::DType::f32).item());
        std::printf("  planned peak %s\n",
                    mt::train::estimate_training_memory(config, planned, mode).summary().c_str());
        if (profile_steps > 0) {
          std::printf("%s", mt::profile_steps(device, profile_steps, [&] { train_step(); }).c_str());
        }
      } catch (const mt::OutOfMemoryError& e) {
        table.print_failure(mode, std::string("out of memory: ") + e.what());
        if (device.is_cuda()) mt::cuda::empty_cache(device.index);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_step: %s\n", e.what());
    return 2;
  }
  return 0;
}
