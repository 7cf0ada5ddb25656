#include "optim/graph_step.h"

#include <string>

#include "autograd/autocast.h"
#include "core/cuda_context.h"
#include "core/error.h"
#include "core/random.h"

namespace mt {

struct CudaGraphStep::Impl {
  Device device;
  std::function<void()> step;
  std::vector<Optimizer*> optimizers;
  int warmup = 0;
  bool enabled = true;
  int eager_runs = 0;
  cuda::Graph graph;
  std::vector<double> captured_lrs;  // every group of every optimizer, in order

  // Every group's learning rate and weight decay, in order: the host values the captured
  // kernels were given.
  std::vector<double> learning_rates() const {
    std::vector<double> values;
    for (const Optimizer* opt : optimizers) {
      for (const ParamGroup& group : opt->param_groups()) {
        values.push_back(group.lr);
        values.push_back(group.weight_decay);
      }
    }
    return values;
  }

  // Per value of learning_rates(): whether a replay reads it from device memory, which
  // prepare_replay() has just refreshed (then it may change).
  std::vector<bool> refresh_for_replay() const {
    std::vector<bool> refreshed;
    for (Optimizer* opt : optimizers) {
      const bool rates_on_device = opt->prepare_replay();
      for (size_t g = 0; g < opt->param_groups().size(); ++g) {
        refreshed.push_back(rates_on_device);  // the learning rate
        refreshed.push_back(false);            // the weight decay
      }
    }
    return refreshed;
  }

  void capture() {
    const uint64_t offset = default_generator(device).offset();
    {
      // run() prepares every replay (refresh_for_replay), so the captured step may read and
      // write the optimizers' autocast copies (Note [Provided copies]).
      const autocast::ServeCopiesInCapture serve_copies(std::vector<const void*>(optimizers.begin(), optimizers.end()));
      graph.capture(cuda::current_stream(device.index), step);
    }
    if (default_generator(device).offset() != offset) {
      graph.replay(cuda::current_stream(device.index));  // this once, as an eager step would have run
      graph = cuda::Graph();
      throw Error(detail::str_cat(
          "CudaGraphStep: the step draws random numbers from ", device.str(),
          "'s default generator (dropout, say); their Philox offsets are fixed when the step is captured, so "
          "every replay would draw the same numbers. Run it without a CUDA Graph, or without random ops"));
    }
    captured_lrs = learning_rates();
    for (Optimizer* opt : optimizers) opt->after_capture();
  }

  void check_learning_rates(const std::vector<bool>& refreshed) const {
    const std::vector<double> now = learning_rates();
    for (size_t i = 0; i < now.size(); ++i) {
      MT_CHECK(refreshed[i] || now[i] == captured_lrs[i], "CudaGraphStep: the ",
               i % 2 == 0 ? "learning rate" : "weight decay", " of parameter group ", i / 2,
               " (counting the groups of every optimizer in order) changed from ", captured_lrs[i], " to ", now[i],
               " after the step was captured; a replay would use the captured one. Call reset() to capture again");
    }
  }
};

CudaGraphStep::CudaGraphStep(Device device, std::function<void()> step, std::vector<Optimizer*> optimizers, int warmup,
                             bool enabled)
    : impl_(std::make_unique<Impl>()) {
  MT_CHECK(static_cast<bool>(step), "CudaGraphStep: no step function");
  MT_CHECK(warmup >= 1, "CudaGraphStep: warmup must be >= 1 (lazily made state must exist before the capture), got ",
           warmup);
  impl_->device = device;
  impl_->step = std::move(step);
  impl_->optimizers = std::move(optimizers);
  impl_->warmup = warmup;
  impl_->enabled = enabled;
}

CudaGraphStep::~CudaGraphStep() = default;

void CudaGraphStep::run() {
  Impl& s = *impl_;
  if (!s.enabled || !s.device.is_cuda()) {
    s.step();
    return;
  }
  if (s.eager_runs < s.warmup) {
    // The last warm-up step (not the first: it makes the lazily made state) is watched as a
    // capture would be, so that a step which keeps or frees tensors across steps is refused
    // while it runs eagerly, before any graph of it exists. Until fixed it is refused again.
    const bool watched = s.warmup >= 2 && s.eager_runs == s.warmup - 1;
    if (watched) {
      const std::string problems = cuda::Graph::observe(cuda::current_stream(s.device.index), s.step);
      MT_CHECK(problems.empty(),
               "CudaGraphStep: the step cannot be replayed from a CUDA Graph as it stands (it ran as an eager "
               "step):",
               problems);
    } else {
      s.step();
    }
    ++s.eager_runs;
    return;
  }
  // Refreshed first: a capture refused for its random numbers runs the step once, and must see the rate of the moment
  // (the fills are enqueued before the capture starts, so they are not recorded).
  const std::vector<bool> refreshed = s.refresh_for_replay();
  if (!s.graph.captured()) s.capture();  // the capture records the step without running it
  s.check_learning_rates(refreshed);
  s.graph.replay(cuda::current_stream(s.device.index));
}

void CudaGraphStep::reset() { impl_->graph = cuda::Graph(); }

bool CudaGraphStep::captured() const { return impl_->graph.captured(); }

size_t CudaGraphStep::graph_nodes() const { return impl_->graph.nodes(); }
void CudaGraphStep::write_graph_dot(const std::string& path) const { impl_->graph.write_dot(path); }

}  // namespace mt
