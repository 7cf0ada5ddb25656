// The small-model step: 4 x Linear(1024) with GELU between, batch 64, fp16 autocast,
// GradScaler and AdamW. Its GPU work is a few tens of microseconds, so what it measures is
// the runtime's own cost per op: launches, allocation, autograd bookkeeping.
//
//   mlp_step --device cuda [--steps 200] [--repeats 5] [--profile 3]
//
// Steps run back to back (as a training loop does) between two device synchronisations; the
// time per step is that span over the steps, and the median over --repeats spans is printed,
// with the step's floors: FLOPs over the GEMM rate and bytes over the copy bandwidth given on
// the command line (the GPU machine's measured figures by default).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/profiler.h"
#include "core/cuda_context.h"
#include "examples/common/cli.h"
#include "ops/backends.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/graph_step.h"
#include "tools/bench/bench_common.h"

namespace {

class Mlp : public mt::nn::Module {
 public:
  Mlp(int64_t width, int64_t layers, mt::Generator* generator) {
    for (int64_t i = 0; i < layers; ++i) {
      auto layer = std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(width, width), generator);
      layers_.push_back(layer);
      register_module("fc" + std::to_string(i), layers_.back(), layer);
    }
  }
  mt::Tensor forward(mt::Tensor x) const {
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = layers_[i]->forward(x);
      if (i + 1 < layers_.size()) x = mt::gelu(x);
    }
    return x;
  }

 private:
  std::vector<std::shared_ptr<mt::nn::Linear>> layers_;
};

using bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time the small-MLP training step (launch-bound)"};
  example::setup(app, "mlp_step");
  example::PlacementFlags placement_flags;
  int64_t width = 1024, layers = 4, batch = 64, warmup = 20, steps = 200, repeats = 5, profile_steps = 0;
  double gemm_tflops = 766, copy_tbps = 4.14;
  placement_flags.add_to(app, example::AmpFlag::without);  // fp16 autocast with loss scaling, always
  app.add_option("--width", width, "features of every layer")->capture_default_str();
  app.add_option("--layers", layers, "Linear layers (GELU between them)")->capture_default_str();
  app.add_option("--batch", batch, "rows per step")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps")->capture_default_str();
  app.add_option("--steps", steps, "steps per timed span")->capture_default_str()->check(example::positive());
  app.add_option("--repeats", repeats, "timed spans (the median is reported)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--profile", profile_steps, "then profile this many steps op by op (0: none)")->capture_default_str();
  bool cuda_graph = false;
  app.add_flag("--cuda-graph", cuda_graph, "capture the step in a CUDA Graph after warm-up and replay it");
  app.add_option("--gemm-tflops", gemm_tflops, "GEMM rate for the FLOP floor")->capture_default_str();
  app.add_option("--copy-tbps", copy_tbps, "copy bandwidth (read + write) for the byte floor")->capture_default_str();
  std::string graph_dot;
  app.add_option("--graph-dot", graph_dot, "with --cuda-graph: write the captured step's graph here (Graphviz dot)");
  bool gemm_autotune = false;
  app.add_flag("--gemm-autotune", gemm_autotune,
               "time cuBLASLt's best few algorithms for each GEMM problem and keep the fastest "
               "(mt::backends::set_matmul_autotune)");
  bool cast_weights = false;
  app.add_flag("--cast-weights", cast_weights,
               "cast the f32 weights to fp16 in every forward, instead of taking the copies AdamW writes as it "
               "updates them (mt::AdamWOptions::autocast_copies)");
  CLI11_PARSE(app, argc, argv);
  mt::backends::set_matmul_autotune(gemm_autotune);

  try {
    const mt::Device device = example::resolve_device(placement_flags.device, /*group=*/nullptr);
    mt::Generator init(0);
    Mlp model(width, layers, &init);
    model.to(device);
    const mt::Tensor x = mt::randn({batch, width}, mt::TensorOptions().device(device), &init);
    const mt::Tensor target = mt::randn({batch, width}, mt::TensorOptions().device(device), &init);
    mt::AdamWOptions adamw(1e-4);
    if (!cast_weights) adamw.autocast_copies(mt::DType::f16);
    mt::AdamW opt(model.parameters(), adamw);
    mt::GradScaler scaler(device);
    auto train_step = [&] {
      mt::Tensor loss;
      {
        mt::AutocastGuard amp(device.type, mt::DType::f16);
        const mt::Tensor diff = mt::sub(model.forward(x), target);
        loss = mt::mean(mt::mul(diff, diff));
      }
      opt.zero_grad(/*set_to_none=*/!cuda_graph);  // a captured step keeps its gradient buffers
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    };
    mt::CudaGraphStep graph_step(device, train_step, {&opt}, /*warmup=*/2, /*enabled=*/cuda_graph);
    auto sync = [&] {
      if (device.is_cuda()) mt::cuda::synchronize_device(device.index);
    };
    for (int64_t i = 0; i < warmup; ++i) graph_step.run();
    if (!graph_dot.empty() && graph_step.captured()) {
      graph_step.write_graph_dot(graph_dot);
      std::printf("mlp_step: graph written to %s\n", graph_dot.c_str());
    }
    std::vector<double> per_step_ms;
    for (int64_t r = 0; r < repeats; ++r) {
      sync();
      const auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < steps; ++i) graph_step.run();
      sync();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      per_step_ms.push_back(ms / static_cast<double>(steps));
    }
    // Floors: forward + backward GEMMs are 6 x params x rows FLOPs; AdamW reads the parameter,
    // gradient and two moments (f32) and writes three of them and an f16 copy (AdamW's, or a cast's).
    const double params = static_cast<double>(layers * (width * width + width));
    const double flops = 6.0 * params * static_cast<double>(batch);
    const double bytes = params * (4 * 4 + 3 * 4 + 2);
    const double flop_floor_ms = flops / (gemm_tflops * 1e12) * 1e3;
    const double byte_floor_ms = bytes / (copy_tbps * 1e12) * 1e3;
    std::printf("mlp_step: %lld x Linear(%lld) + GELU, batch %lld, fp16 autocast + GradScaler + AdamW on %s%s%s\n",
                static_cast<long long>(layers), static_cast<long long>(width), static_cast<long long>(batch),
                device.str().c_str(), cast_weights ? ", weights cast at every step" : "",
                graph_step.captured()
                    ? (", replaying a CUDA Graph of " + std::to_string(graph_step.graph_nodes()) + " nodes").c_str()
                    : "");
    std::printf(
        "mlp_step: %.3f ms per step (median of %lld spans of %lld steps); floors: %.4f ms of FLOPs at %.0f "
        "TFLOP/s, %.4f ms of bytes at %.2f TB/s\n",
        median(per_step_ms), static_cast<long long>(repeats), static_cast<long long>(steps), flop_floor_ms, gemm_tflops,
        byte_floor_ms, copy_tbps);
    if (profile_steps > 0) std::printf("%s", mt::profile_steps(device, profile_steps, train_step).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_step: %s\n", e.what());
    return 2;
  }
  return 0;
}
