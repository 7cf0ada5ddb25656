#include "train/report.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_context.h"
#include "optim/adamw.h"

namespace mt::train {

namespace {

// ---- memory ----

// Sums the bytes of tensors on one device, each storage range once: a tensor reached twice (a tied
// weight, the same tensor in two groups) must not count twice.
class ByteCounter {
 public:
  explicit ByteCounter(Device device) : device_(device) {}
  int64_t add(const Tensor& t) {
    if (!t.defined() || !(t.device() == device_) || t.nbytes() == 0) return 0;
    if (!seen_.emplace(t.data_ptr(), t.nbytes()).second) return 0;
    return static_cast<int64_t>(t.nbytes());
  }

 private:
  Device device_;
  std::set<std::pair<const void*, size_t>> seen_;
};

}  // namespace

MemoryBreakdown memory_breakdown(const nn::Module& model, const Optimizer& optimizer, const Device& device) {
  MemoryBreakdown m;
  ByteCounter count(device);
  // The optimizer's parameters too: one the module does not hold (a head kept outside it) is still
  // this run's, and the counter skips those the module holds.
  std::vector<Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params.push_back(p);
  for (const ParamGroup& g : optimizer.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
  for (const Tensor& p : params) m.parameters += count.add(p);
  for (const auto& [name, b] : model.named_buffers()) m.parameters += count.add(b);
  for (const Tensor& p : params) m.gradients += count.add(p.grad());
  for (const auto& [name, s] : optimizer.state_dict()) m.optimizer_state += count.add(s);
  if (const auto* adamw = dynamic_cast<const AdamW*>(&optimizer)) {
    const std::vector<ParamGroup>& groups = adamw->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].params.size(); ++i) m.optimizer_state += count.add(adamw->autocast_copy(g, i));
    }
  }
  if (device.is_cuda()) {
    const cuda::MemoryStats stats = cuda::memory_stats(device.index);
    m.on_device = true;
    m.peak = static_cast<int64_t>(stats.peak_allocated);
    m.reserved = static_cast<int64_t>(stats.reserved);
    const int64_t held = m.parameters + m.gradients + m.optimizer_state + m.workspaces;
    m.activations = std::max<int64_t>(0, m.peak - held);
  }
  return m;
}

// ---- op families ----

namespace {

// The op names the profiler's labels carry (a node's name without "Backward", which is the forward
// label's name too), by the ops/ folder that defines them. An op added to ops/ belongs here.
const std::map<std::string, std::string>& family_of_op() {
  static const auto* table = [] {
    const std::vector<std::pair<const char*, std::vector<const char*>>> families = {
        {"matmul", {"Matmul", "Bmm", "Linear", "LinearGelu", "MlpGelu", "LoraLinear"}},
        {"attention", {"ScaledDotProductAttention"}},
        {"norm", {"LayerNorm", "RmsNorm", "AddLayerNorm", "AddRmsNorm"}},
        {"softmax", {"Softmax", "LogSoftmax"}},
        {"loss", {"CrossEntropy", "LinearCrossEntropy"}},
        // The binary ops are capitalised, the unary ones (elementwise.cpp's unary_op) keep the op's
        // own name; "mul" is x * x. Cast is autograd/tensor_autograd.cpp's dtype conversion.
        {"elementwise", {"Add",  "AddScalar", "Sub", "Mul", "MulScalar", "Div",     "mul",  "rdiv", "exp",  "log",
                         "sqrt", "rsqrt",     "pow", "abs", "tanh",      "sigmoid", "relu", "silu", "gelu", "Cast"}},
        {"embedding", {"Embedding"}},
        {"dropout", {"Dropout"}},
        {"conv", {"Conv2d", "MaxPool2d", "AvgPool2d"}},
        {"reduction", {"Sum", "Max"}},
        // ToDevice: a copy to another device (autograd/tensor_autograd.cpp), data movement like Contiguous.
        {"shape",
         {"View", "Reshape", "Transpose", "Permute", "Narrow", "Slice", "Expand", "Squeeze", "Unsqueeze", "Contiguous",
          "Clone", "Cat", "Split", "ToDevice"}},
        {"where", {"Where", "MaskedFill"}},
        // The engine's own nodes: a leaf's gradient accumulation, a checkpointed region's recompute
        // (whose ops are marked again, each under its own family, as they rerun).
        {"autograd", {"AccumulateGrad", "Checkpoint"}},
    };
    auto* map = new std::map<std::string, std::string>();  // never destroyed: read by reports at exit
    for (const auto& [family, ops] : families) {
      for (const char* op : ops) map->emplace(op, family);
    }
    return map;
  }();
  return *table;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// "ScaledDotProductAttentionBackward(cuDNN)" -> "ScaledDotProductAttention": the backend tag, then
// the node suffix. (forward_op_name() strips the suffix only where it ends the name, so a tagged
// node keeps it in its forward label too.)
std::string op_name(std::string name) {
  const size_t tag = name.find('(');
  if (tag != std::string::npos && tag > 0) name.resize(tag);
  const std::string suffix = "Backward";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.resize(name.size() - suffix.size());
  }
  return name;
}

}  // namespace

std::string op_family(const std::string& profiler_label) {
  if (profiler_label == "after backward") return "optimizer";
  if (profiler_label == "backward (between nodes)") return "autograd";
  std::string name;
  if (starts_with(profiler_label, "forward ")) {
    name = profiler_label.substr(8);
  } else if (starts_with(profiler_label, "backward ")) {
    name = profiler_label.substr(9);
  } else {
    return "other";
  }
  const auto& table = family_of_op();
  const auto it = table.find(op_name(name));
  return it == table.end() ? "other" : it->second;
}

// ---- the report ----

namespace {

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  char line[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(line, sizeof line, fmt, args);
  va_end(args);
  return line;
}

std::string bytes(int64_t n) { return cuda::format_bytes(static_cast<size_t>(std::max<int64_t>(n, 0))); }

std::string time_section(const OpProfiler& profiler) {
  const double steps = static_cast<double>(std::max<int64_t>(profiler.steps(), 1));
  std::map<std::string, double> family_ms;
  double total = 0;
  for (const OpProfiler::Row& r : profiler.rows()) {
    family_ms[op_family(r.label)] += r.total_ms;
    total += r.total_ms;
  }
  std::vector<std::pair<std::string, double>> sorted(family_ms.begin(), family_ms.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });

  std::string out = strf("time per step by op family (%lld profiled steps, %.3f ms per step)\n",
                         static_cast<long long>(profiler.steps()), total / steps);
  for (const auto& [family, ms] : sorted) {
    out += strf("  %-14s %10.3f ms %6.1f%%\n", family.c_str(), ms / steps, total > 0 ? 100.0 * ms / total : 0.0);
  }
  return out;
}

// Module rows charge each interval to the innermost module open when it was marked (and the rest
// to "(outside modules)"), so they add up to the profiled time like the families do.
std::string module_section(const std::vector<OpProfiler::Row>& rows, double steps) {
  constexpr size_t kTop = 10;
  std::vector<OpProfiler::Row> sorted = rows;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const OpProfiler::Row& a, const OpProfiler::Row& b) { return a.total_ms > b.total_ms; });
  double total = 0;
  for (const OpProfiler::Row& r : sorted) total += r.total_ms;
  std::string out = "time per step by module (top modules)\n";
  for (size_t i = 0; i < sorted.size() && i < kTop; ++i) {
    out += strf("  %-40s %10.3f ms %6.1f%%\n", sorted[i].label.c_str(), sorted[i].total_ms / steps,
                total > 0 ? 100.0 * sorted[i].total_ms / total : 0.0);
  }
  if (sorted.size() > kTop) {
    double rest = 0;
    for (size_t i = kTop; i < sorted.size(); ++i) rest += sorted[i].total_ms;
    out += strf("  %-40s %10.3f ms %6.1f%%\n", strf("(%zu more modules)", sorted.size() - kTop).c_str(), rest / steps,
                total > 0 ? 100.0 * rest / total : 0.0);
  }
  return out;
}

std::string memory_section(const MemoryBreakdown& m) {
  struct Part {
    const char* name;
    int64_t bytes;
  };
  std::vector<Part> parts = {
      {"parameters", m.parameters}, {"gradients", m.gradients}, {"optimizer state", m.optimizer_state}};
  if (m.workspaces > 0) parts.push_back({"workspaces", m.workspaces});
  std::string out;
  if (!m.on_device) {
    out += "memory (no device memory figures on the CPU: the peak and the activations are measured on CUDA)\n";
    for (const Part& p : parts) out += strf("  %-30s %12s\n", p.name, bytes(p.bytes).c_str());
    return out;
  }
  // With no workspace figure the activations row holds them, and says so.
  parts.push_back(
      {m.workspaces > 0 ? "activations and temporaries" : "activations, temporaries, workspaces", m.activations});
  out += strf("memory: peak %s allocated, %s reserved\n", bytes(m.peak).c_str(), bytes(m.reserved).c_str());
  for (const Part& p : parts) {
    out += strf("  %-38s %12s %6.1f%%\n", p.name, bytes(p.bytes).c_str(),
                m.peak > 0 ? 100.0 * static_cast<double>(p.bytes) / static_cast<double>(m.peak) : 0.0);
  }
  return out;
}

}  // namespace

std::string run_report(const RunReportInput& input) {
  std::string out = "run report\n";
  if (input.steps > 0) {
    out += strf("%lld steps in %.1f s: %.1f ms per step\n", static_cast<long long>(input.steps), input.seconds,
                1000.0 * input.seconds / static_cast<double>(input.steps));
  }
  if (input.profiler != nullptr) {
    out += time_section(*input.profiler);
  } else {
    out += "time per step by op family: no op profile was taken\n";
  }
  if (!input.module_rows.empty()) {
    const int64_t steps = input.profiler != nullptr ? input.profiler->steps() : input.steps;
    out += module_section(input.module_rows, static_cast<double>(std::max<int64_t>(steps, 1)));
  }
  out += memory_section(input.memory);
  return out;
}

}  // namespace mt::train
