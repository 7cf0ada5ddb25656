// The end-of-run report: where the step time and the memory went.
//
//   mt::OpProfiler profiler(device);
//   for (...) { train_step(); profiler.step(); }
//   mt::train::RunReportInput in;
//   in.profiler = &profiler;
//   in.module_rows = profiler.module_rows();
//   in.memory = mt::train::memory_breakdown(model, optimizer, device);  // before zero_grad(): see below
//   in.steps = steps;
//   in.seconds = seconds;
//   std::cout << mt::train::run_report(in);
//
// Time: every profiler row is charged to an op family (op_family), named after the ops/ folder
// that holds the op, so a step reads as "matmul 61%, norm 9%, optimizer 7% ..." instead of forty
// labels. Memory: what the run's state holds (parameters, gradients, optimizer state), counted
// exactly from the tensors, against the device's peak; the rest of the peak is what the step
// held for a while (activations, temporaries, library workspaces). The device's peak is taken
// over everything allocated on it since the last cuda::reset_peak_memory, so the split is exact
// only when the model and its optimizer are what the device holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/profiler.h"
#include "core/device.h"
#include "ops/nn/module.h"
#include "optim/optimizer.h"

namespace mt::train {

// Bytes on one device. parameters + gradients + optimizer_state + workspaces + activations = peak
// on a CUDA device (activations is that difference, never negative); on the CPU there are no
// allocator figures, so peak, reserved and activations stay 0 and on_device is false.
struct MemoryBreakdown {
  int64_t parameters = 0;  // the module's parameters (trainable or not) and buffers, and the optimizer's
  int64_t gradients = 0;   // the parameters' gradients that exist at the call
  // optimizer.state_dict() (moments, step counts, master weights) and AdamW's autocast copies
  int64_t optimizer_state = 0;
  int64_t activations = 0;  // the rest of the peak: activations, temporaries (and the workspaces, see below)
  // The vendor libraries' workspaces that stay allocated (cuBLASLt's per stream, the norms' partial
  // rows): ops/ exposes none of them, so this stays 0 and they are counted in activations.
  int64_t workspaces = 0;
  int64_t peak = 0;      // cuda::memory_stats(device.index).peak_allocated
  int64_t reserved = 0;  // cuda::memory_stats(device.index).reserved: the pool, live and cached
  bool on_device = false;
};

// Tensors count once however often they are reached (a tied weight, a gradient that is a view
// into a DDP bucket counts its own bytes), and only those on `device`. The gradients are those
// that exist now: call it after backward (or after the step) and before zero_grad(), whose
// default frees them.
MemoryBreakdown memory_breakdown(const nn::Module& model, const Optimizer& optimizer, const Device& device);

// The op family of an OpProfiler label (autograd/profiler.h):
//   "forward Matmul", "backward MatmulBackward", "forward LinearGelu" -> "matmul"
//   "forward gelu", "forward Add", "forward Cast"                     -> "elementwise"
//   "after backward" -> "optimizer"; "backward (between nodes)", "backward AccumulateGrad" -> "autograd"
// The families are the ops/ folders: matmul, attention, norm, softmax, loss, elementwise,
// embedding, dropout, conv, reduction, shape, where. A dtype cast counts as elementwise and a copy
// to another device as shape (both live in autograd/tensor_autograd.cpp, outside ops/). A label
// no family claims (an op added to ops/ but not to the table in report.cpp) is "other".
std::string op_family(const std::string& profiler_label);

struct RunReportInput {
  const OpProfiler* profiler = nullptr;  // the time section; none: the report says no profile was taken
  // OpProfiler::module_rows() of the same profiler (totals over its steps), or empty.
  std::vector<OpProfiler::Row> module_rows;
  MemoryBreakdown memory;
  int64_t steps = 0;   // the run's steps, and
  double seconds = 0;  // its wall time: the report's first line
};

// The report printed at the end of a run, several lines ending in a newline:
//   the run's steps and time per step;
//   time per profiled step by op family (ms and share; the shares add up to 100%);
//   the top modules' time per step and share (module_rows), when given;
//   the memory breakdown (GiB/MiB), with each part's share of the peak on a CUDA device.
std::string run_report(const RunReportInput& input);

}  // namespace mt::train
