// Where a training step's time goes, op by op: a small torch.profiler.
//
//   mt::OpProfiler profiler(mt::cuda_device(0));  // marks from now on
//   for (...) { train_step(); profiler.step(); }  // step() closes one step
//   std::cout << profiler.report();               // ops by time: ms per step, share
//
// Marks cut the step into intervals, each charged to the label of the mark that
// ends it:
//   "forward <op>"     from the previous mark to the op's autograd::record, so the
//                      casts and copies it made on the way are its own
//   "backward <Node>"  a backward node's apply()
//   "backward (between nodes)"  the engine's work between two nodes: gradient
//                      accumulation, zero-filling, hooks (DDP's reduction calls)
//   "after backward"   from the last mark to step(): the optimizer, the scaler
// Ops that record nothing (under no_grad, or not differentiable) fall into the
// interval of the next mark. On CUDA a mark is a timing event on the device's
// current stream: the figures are device time, with no synchronisation inside a
// step; step() waits once for the step's last event. On the CPU marks read a
// steady clock. One profiler at a time per process.
//
// The same intervals by module (module_rows, module_report): a forward interval goes to the
// innermost module scope open on its thread when its mark was made (the scope each module's
// forward opens, ops/nn/module.h's TraceScope, while a profiler is active), a backward node's
// interval to the module whose forward recorded the node, and everything else (engine work
// between nodes, gradient accumulation, "after backward") to "(outside modules)". Each interval
// is charged once either way, so both tables add up to the same total.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"

namespace mt {

class OpProfiler {
 public:
  explicit OpProfiler(Device device);
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  void step();  // ends a step: waits for its marks and adds their intervals up
  struct Row {
    std::string label;
    double total_ms = 0;
    int64_t calls = 0;
  };
  std::vector<Row> rows() const;  // sorted by total time, descending
  // The same intervals charged to module paths ("gpt.transformer.h.0.attn"), sorted likewise;
  // calls counts the intervals charged.
  std::vector<Row> module_rows() const;
  int64_t steps() const { return steps_; }
  double total_ms() const;                           // over all steps
  std::string report(size_t top = 40) const;         // a table of per-step figures
  std::string module_report(size_t top = 40) const;  // the same by module

  // Called by autograd (record, the engine) while a profiler is active. `module` is the scope the
  // interval ending here is charged to in module_rows(): an interned path from current_module()
  // or a node's profiler_module; null for "(outside modules)".
  static bool active();
  static void mark(const std::string& label, const std::string* module = nullptr);

  // Module scopes, one thread-local stack per thread: TraceScope pushes a module's path while a
  // profiler is active and pops it when the forward ends. Paths are interned for the life of the
  // process, so a pointer from current_module() may be kept (autograd::Node::profiler_module).
  static void push_module(const std::string& path);
  static void pop_module();
  static const std::string* current_module();  // this thread's innermost open scope, or null

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t steps_ = 0;
};

// The loop of the example above: runs `step` `steps` times under a profiler of `device` and
// returns its report (the benchmarks' --profile).
std::string profile_steps(Device device, int64_t steps, const std::function<void()>& step);

}  // namespace mt
