// A training step captured in a CUDA Graph once its shapes are static, then replayed with
// one launch: a model of small layers is bound by kernel launches, not by the GPU.
//
//   mt::CudaGraphStep step(device, [&] {          // the whole step: forward, backward,
//     opt.zero_grad(/*set_to_none=*/false);        // scaler and optimizer
//     mt::Tensor loss = ...;                       // reads the input tensors x, y
//     scaler.scale(loss).backward();
//     scaler.step(opt);
//     scaler.update();
//     loss_out.copy_(loss);                        // results into tensors made beforehand
//   }, {&opt});
//   for (...) { x.copy_(batch); step.run(); }     // new data goes into the same tensors
//
// The first `warmup` runs run the step eagerly, so that what it makes lazily (gradients,
// optimizer moments, cuBLASLt workspaces, cuDNN plans) exists before the capture; the next
// run captures it on the device's current stream (cuda::Graph, whose rules it inherits: no
// host synchronisation, results into existing tensors) and replays it; every later run
// replays. On the CPU run() simply calls the step. With warmup >= 2 the last warm-up run is
// watched as a capture would be (cuda::Graph::observe): a step that keeps or frees tensors
// across steps (gradients set to none, say) is refused then, while it runs eagerly, and no
// graph of it is made; with warmup 1 the capture itself refuses it, and that step does not run.
//
// Before each replay the given optimizers bring what their kernels read from device memory
// up to date (Optimizer::prepare_replay): AdamW reads its learning rates there, so a
// schedule may change them between replays. What a replay cannot change is checked, never
// left stale: another optimizer's learning rate, or any weight decay, that differs from the
// captured one is an error (reset() captures again), and so is a step that draws random numbers from the device's
// default generator (dropout): their Philox offsets are fixed at capture, so every replay would draw the same ones (a
// refused capture still runs the step once). Host code inside the step runs only at capture: a GradScaler's limit
// check, say, needs scaler.check_limits() between replays now and then.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "optim/optimizer.h"

namespace mt {

class CudaGraphStep {
 public:
  // enabled false: run() always calls the step eagerly (a command-line switch, say).
  CudaGraphStep(Device device, std::function<void()> step, std::vector<Optimizer*> optimizers = {}, int warmup = 2,
                bool enabled = true);
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  void run();
  void reset();           // the next run captures again (after a learning-rate change, say)
  bool captured() const;  // whether runs now replay a graph
  size_t graph_nodes() const;
  void write_graph_dot(const std::string& path) const;  // cuda::Graph::write_dot, once captured()

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
