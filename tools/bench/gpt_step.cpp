// One GPT training step, timed and measured, per gradient-checkpointing mode:
// peak memory (the allocator's high-water mark) and the median step time.
//
//   gpt_step --device cuda --checkpoint off,blocks,selective --lora-r 8 --lora-targets c_attn
//
// Defaults are GPT-2 124M's shape (12 layers, 768 wide, 12 heads, vocab 50304) at B=16, T=1024
// in bf16 autocast. Steps are timed on the host around a device synchronisation, after
// warm-up steps; the data are random token ids.
//
// Under mpirun it trains data-parallel (DistributedDataParallel, one GPU per rank, B per rank)
// and rank 0 also prints the communication each step left exposed: the time the compute stream
// waited for the all-reduces at the end of backward (median).
//
// --nvtx (or MT_NVTX=1) turns on the NVTX ranges nsys shows: step > forward > each module by its
// path ("gpt.transformer.h.0.attn"), backward, optimizer, DDP's bucket all-reduces, checkpoint
// recomputations (docs/profiling.md). MT_TRACE=FILE.json writes the same ranges as a host trace.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <sstream>

#include "autograd/profiler.h"
#include "core/cuda_context.h"
#include "core/nvtx.h"
#include "distributed/ddp.h"
#include "examples/common/cli.h"
#include "examples/lm/trainer.h"
#include "ops/backends.h"
#include "ops/fp8/fp8_autocast.h"
#include "ops/nn/gpt.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/graph_step.h"
#include "tools/bench/bench_common.h"

namespace {

using bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time a GPT training step and measure its peak memory per checkpointing mode"};
  example::setup(app, "gpt_step");
  example::PlacementFlags placement_flags;
  mt::nn::GPTConfig config;
  config.vocab_size = 50304;
  int64_t batch = 16, seq = 1024, warmup = 3, steps = 10, lora_r = 8;
  std::string modes = "off,blocks,selective", targets = "c_attn";
  placement_flags.add_to(app);
  app.add_option("--layers", config.n_layer, "blocks")->capture_default_str();
  app.add_option("--heads", config.n_head, "attention heads")->capture_default_str();
  app.add_option("--embd", config.n_embd, "width")->capture_default_str();
  app.add_option("--vocab", config.vocab_size, "vocabulary")->capture_default_str();
  app.add_option("--batch", batch, "sequences per step")->capture_default_str();
  app.add_option("--seq-len", seq, "tokens per sequence")->capture_default_str();
  app.add_option("--lora-r", lora_r, "LoRA rank (0: train every parameter)")->capture_default_str();
  app.add_option("--lora-targets", targets, "LoRA target modules")->capture_default_str();
  app.add_option("--checkpoint", modes, "comma-separated checkpointing modes to measure")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps per mode")->capture_default_str();
  app.add_option("--steps", steps, "timed steps per mode")->capture_default_str()->check(example::positive());
  bool cuda_graph = false;
  app.add_flag("--cuda-graph", cuda_graph,
               "capture each mode's step in a CUDA Graph after warm-up and replay it (one GPU, no dropout)");
  std::string ddp_update = "overlapped";
  app.add_option("--ddp-update", ddp_update,
                 "under mpirun: overlapped (DistributedDataParallel::step, the update of the early buckets "
                 "hides the last all-reduce) or after (synchronize, then the optimizer)")
      ->capture_default_str()
      ->check(example::one_of({"overlapped", "after"}));
  int64_t head_chunk_rows = 0;
  app.add_option("--head-chunk-rows", head_chunk_rows,
                 "rows of logits the fused LM head forms at a time (0: linear_cross_entropy's default)")
      ->capture_default_str()
      ->check(example::non_negative());
  bool unfused = false;
  app.add_flag("--unfused", unfused,
               "separate add, layer_norm, linear_gelu and linear ops in place of add_layer_norm and mlp_gelu "
               "(the same values for the model's f32 residual stream; shows what the fusions buy)");
  bool gemm_autotune = false;
  app.add_flag("--gemm-autotune", gemm_autotune,
               "time cuBLASLt's best few algorithms for each GEMM problem and keep the fastest "
               "(mt::backends::set_matmul_autotune)");
  bool cast_weights = false;
  app.add_flag("--cast-weights", cast_weights,
               "autocast casts the f32 weights at every step, instead of taking the low-precision copies AdamW "
               "writes as it updates them (mt::AdamWOptions::autocast_copies)");
  bool nvtx_ranges = false;
  app.add_flag("--nvtx", nvtx_ranges,
               "NVTX ranges for nsys: the step, forward, backward and optimizer, each module by its path, DDP's "
               "all-reduces (as MT_NVTX=1; docs/profiling.md)");
  std::string precision = "amp";
  app.add_option("--precision", precision,
                 "amp: every GEMM in the --amp dtype; fp8: the blocks' Linear layers in FP8 under the bf16 autocast "
                 "(mt::Fp8AutocastGuard, --fp8-recipe; the LM head stays bf16)")
      ->capture_default_str()
      ->check(example::one_of({"amp", "fp8"}));
  std::string fp8_recipe = "delayed";
  app.add_option("--fp8-recipe", fp8_recipe,
                 "with --precision fp8: delayed (scales from an amax history of 16) or current (from each tensor "
                 "itself, one pass more)")
      ->capture_default_str()
      ->check(example::one_of({"delayed", "current"}));
  int64_t profile_steps = 0;
  app.add_option("--profile", profile_steps, "after timing, profile this many steps per mode, op by op (0: none)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  mt::backends::set_matmul_autotune(gemm_autotune);

  try {
    const example::Placement placement = placement_flags.resolve();
    mt::dist::ProcessGroup* group = placement.group;
    const int rank = placement.rank(), world = placement.world_size();
    const mt::Device device = placement.device;
    const std::string amp = !placement.amp ? "off" : *placement.amp == mt::DType::f16 ? "fp16" : "bf16";
    if (rank != 0) std::freopen("/dev/null", "w", stdout);  // rank 0 reports
    const bool fp8 = precision == "fp8";
    const mt::Fp8Recipe recipe = fp8_recipe == "current" ? mt::Fp8Recipe::current() : mt::Fp8Recipe::delayed();
    MT_CHECK(!fp8 || placement.amp == mt::DType::bf16, "--precision fp8 runs under bf16 autocast: pass --amp bf16");
    // FP8 is a full-training mode here (LoRA layers run their own bf16 forward), and FP8 layers
    // cannot be recomputed inside a checkpointed block: refused before any mode runs.
    MT_CHECK(!fp8 || lora_r == 0, "--precision fp8 times full training: pass --lora-r 0");
    for (const std::string& mode : lm_example::split_commas(modes)) {
      MT_CHECK(!fp8 || mt::nn::GPTCheckpointing::parse(mode).recomputed(config.n_layer) == 0,
               "--precision fp8 cannot run --checkpoint ", mode,
               " (FP8 layers are not recomputed inside a checkpointed block): use off or selective");
    }
    config.n_positions = seq;
    mt::Generator init(0);
    mt::nn::GPT model(config, &init);
    model.to(device);
    if (lora_r > 0) {
      mt::nn::LoRAOptions lora;
      lora.r = lora_r;
      lora.alpha = 2.0 * static_cast<double>(lora_r);
      lora.target_modules = lm_example::split_commas(targets);
      mt::nn::apply_lora(model, lora, &init);
    }
    model.set_fused_ops(!unfused);
    model.head_chunk_rows = head_chunk_rows;
    mt::nn::name_modules_for_tracing(model, "gpt");  // after apply_lora: its layers take their paths too
    if (nvtx_ranges) mt::nvtx::set_enabled(true);
    if (mt::nvtx::enabled() && !mt::nvtx::compiled_in()) {
      std::fprintf(stderr,
                   "gpt_step: NVTX was compiled out (MT_NVTX=OFF, or no NVTX 3 headers): the ranges reach "
                   "only a host trace (MT_TRACE)\n");
    }
    std::printf("gpt_step: %lld layers, width %lld, vocab %lld, B=%lld T=%lld, %s, amp %s%s%s%s; %s\n",
                static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
                static_cast<long long>(config.vocab_size), static_cast<long long>(batch), static_cast<long long>(seq),
                device.str().c_str(), fp8 ? "bf16 + fp8 Linear" : amp.c_str(), unfused ? ", unfused" : "",
                amp != "off" && cast_weights ? ", weights cast at every step" : "",
                mt::nvtx::enabled() ? ", NVTX ranges on" : "", mt::nn::trainable_parameters_summary(model).c_str());
    MT_CHECK(!(cuda_graph && group), "--cuda-graph is for one process (NCCL is not captured)");
    MT_CHECK(!cuda_graph || device.is_cuda(), "--cuda-graph needs --device cuda");
    std::unique_ptr<mt::dist::DistributedDataParallel> ddp;
    if (group) {
      ddp = std::make_unique<mt::dist::DistributedDataParallel>(model, *group);
      std::printf("gpt_step: data parallel over %d ranks, B=%lld per rank, %zu buckets, optimizer update %s\n", world,
                  static_cast<long long>(batch), ddp->num_buckets(),
                  ddp_update == "overlapped" ? "overlapped with the last all-reduce" : "after every all-reduce");
    }
    mt::Generator data(1 + static_cast<uint64_t>(rank));  // each rank its own tokens
    const mt::Tensor ids = mt::uniform({batch, seq + 1}, 0, static_cast<double>(config.vocab_size), {}, &data)
                               .to(mt::DType::i64)
                               .to(device);
    const mt::Tensor x = ids.slice(1, 0, seq), y = ids.slice(1, 1, seq + 1);
    const bool autocast = placement.amp.has_value();
    const mt::DType low = placement.amp.value_or(mt::DType::bf16);
    bench::StepTable table(device);
    table.print_header();
    for (const std::string& mode : lm_example::split_commas(modes)) {
      model.set_checkpointing(mt::nn::GPTCheckpointing::parse(mode));
      mt::AdamWOptions adamw(1e-4);
      if (autocast && !cast_weights) adamw.autocast_copies(low);
      mt::AdamW opt(model.trainable_parameters(), adamw);
      std::vector<double> exposed;
      const mt::Tensor loss_out = mt::zeros({1}, mt::TensorOptions().device(device));
      auto train_step = [&] {
        const mt::nvtx::Range step_range("step");
        mt::Tensor loss;
        {
          const mt::nvtx::Range range("forward");
          mt::AutocastGuard guard(device.type, low, autocast);
          mt::Fp8AutocastGuard fp8_guard(device.type, recipe, fp8);
          loss = model.loss(x, y);
        }
        if (ddp) {
          ddp->zero_grad();
        } else {
          opt.zero_grad(/*set_to_none=*/!cuda_graph);  // a captured step keeps its gradient buffers
        }
        {
          const mt::nvtx::Range range("backward");
          loss.backward();
        }
        {
          const mt::nvtx::Range range("optimizer");
          if (ddp && ddp_update == "overlapped") {
            ddp->step(opt);
          } else {
            if (ddp) ddp->synchronize();
            opt.step();
          }
        }
        loss_out.copy_(loss.detach().to(mt::DType::f32).reshape({1}));
      };
      mt::CudaGraphStep graph_step(device, train_step, {&opt}, /*warmup=*/2, /*enabled=*/cuda_graph);
      const std::vector<double> times = bench::time_steps(device, warmup, steps, [&](int64_t step) {
        graph_step.run();
        if (ddp && step >= warmup) exposed.push_back(ddp->last_exposed_comm_ms());
      });
      const double loss_value = loss_out.item();
      const double ms = 1e3 * median(times);
      // A replayed graph allocates through its own memory nodes, which the allocator's counters never see.
      table.print_row(mode, ms, static_cast<double>(world * batch * seq), loss_value,
                      cuda_graph ? "n/a (CUDA Graph)" : nullptr);
      if (ddp) {
        const double comm = median(exposed);
        std::printf("%-10s exposed communication %.2f ms per step (%.1f%% of the step), tokens/s over %d ranks\n",
                    mode.c_str(), comm, 100.0 * comm / ms, world);
      }
      if (graph_step.captured()) {
        std::printf("%-10s replaying a CUDA Graph of %zu nodes\n", mode.c_str(), graph_step.graph_nodes());
      }
      std::fflush(stdout);
      if (profile_steps > 0) std::printf("%s", mt::profile_steps(device, profile_steps, train_step).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_step: %s\n", e.what());
    return 2;
  }
  return 0;
}
