#include "autograd/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/cuda_context.h"
#include "core/error.h"

namespace mt {

namespace {
std::atomic<OpProfiler*> g_active{nullptr};

constexpr const char* kOutsideModules = "(outside modules)";

// Module paths, interned once for the life of the process (never destroyed: nodes that keep a
// pointer may outlive any profiler and static destruction order).
const std::string* intern_module(const std::string& path) {
  static std::mutex mutex;
  static auto* paths = new std::unordered_set<std::string>;
  std::lock_guard<std::mutex> lock(mutex);
  return &*paths->insert(path).first;
}

thread_local std::vector<const std::string*> t_module_scopes;
}  // namespace

// Marks of the open step: a label index and either a CUDA event (from a pool
// reused across steps) or a host time.
struct OpProfiler::Impl {
  Device device;
  std::vector<std::string> labels;
  std::map<std::string, size_t> label_index;
  std::vector<double> label_ms;
  std::vector<int64_t> label_calls;
  std::vector<size_t> open_labels;  // one per mark of the open step
  // By module: index 0 is "(outside modules)"; the others are interned paths.
  std::vector<std::string> module_labels{kOutsideModules};
  std::unordered_map<const std::string*, size_t> module_index;
  std::vector<double> module_ms{0.0};
  std::vector<int64_t> module_calls{0};
  std::vector<size_t> open_modules;  // one per mark of the open step, beside open_labels
  std::vector<cuda::Event> events;   // events[i] belongs to open mark i (pooled)
  std::vector<std::chrono::steady_clock::time_point> times;
  std::mutex mutex;

  size_t intern(const std::string& label) {
    auto it = label_index.find(label);
    if (it != label_index.end()) return it->second;
    labels.push_back(label);
    label_ms.push_back(0);
    label_calls.push_back(0);
    return label_index.emplace(label, labels.size() - 1).first->second;
  }

  size_t module_slot(const std::string* module) {
    if (module == nullptr) return 0;
    auto it = module_index.find(module);
    if (it != module_index.end()) return it->second;
    module_labels.push_back(*module);
    module_ms.push_back(0);
    module_calls.push_back(0);
    return module_index.emplace(module, module_labels.size() - 1).first->second;
  }

  void add_mark(const std::string& label, const std::string* module) {
    std::lock_guard<std::mutex> lock(mutex);
    const size_t i = open_labels.size();
    open_labels.push_back(intern(label));
    open_modules.push_back(module_slot(module));
    if (device.is_cuda()) {
      if (events.size() <= i) events.emplace_back(device.index, cuda::Event::Timing::enabled);
      events[i].record(cuda::current_stream(device.index));
    } else {
      times.push_back(std::chrono::steady_clock::now());
    }
  }

  // Charges every interval of the open step to its closing mark's label and
  // keeps the last mark as the start of the next step.
  void close_step() {
    std::lock_guard<std::mutex> lock(mutex);
    const size_t n = open_labels.size();
    if (n < 2) return;
    if (device.is_cuda()) events[n - 1].synchronize();
    for (size_t i = 1; i < n; ++i) {
      const double ms = device.is_cuda() ? static_cast<double>(events[i - 1].elapsed_ms(events[i]))
                                         : std::chrono::duration<double, std::milli>(times[i] - times[i - 1]).count();
      label_ms[open_labels[i]] += ms;
      label_calls[open_labels[i]] += 1;
      module_ms[open_modules[i]] += ms;
      module_calls[open_modules[i]] += 1;
    }
    open_labels = {open_labels[n - 1]};
    open_modules = {open_modules[n - 1]};
    if (device.is_cuda()) {
      std::swap(events[0], events[n - 1]);
    } else {
      times = {times[n - 1]};
    }
  }
};

OpProfiler::OpProfiler(Device device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  OpProfiler* expected = nullptr;
  MT_CHECK(g_active.compare_exchange_strong(expected, this), "OpProfiler: another profiler is already active");
  impl_->add_mark("start", nullptr);
}

OpProfiler::~OpProfiler() { g_active.store(nullptr); }

bool OpProfiler::active() { return g_active.load(std::memory_order_relaxed) != nullptr; }

void OpProfiler::mark(const std::string& label, const std::string* module) {
  OpProfiler* p = g_active.load(std::memory_order_relaxed);
  if (p != nullptr) p->impl_->add_mark(label, module);
}

void OpProfiler::push_module(const std::string& path) { t_module_scopes.push_back(intern_module(path)); }

void OpProfiler::pop_module() {
  MT_INTERNAL_ASSERT(!t_module_scopes.empty(), "OpProfiler::pop_module: no module scope is open on this thread");
  t_module_scopes.pop_back();
}

const std::string* OpProfiler::current_module() { return t_module_scopes.empty() ? nullptr : t_module_scopes.back(); }

void OpProfiler::step() {
  impl_->add_mark("after backward", nullptr);
  impl_->close_step();
  ++steps_;
}

namespace {

std::vector<OpProfiler::Row> sorted_rows(const std::vector<std::string>& labels, const std::vector<double>& ms,
                                         const std::vector<int64_t>& calls) {
  std::vector<OpProfiler::Row> out;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (calls[i] > 0) out.push_back(OpProfiler::Row{labels[i], ms[i], calls[i]});
  }
  std::sort(out.begin(), out.end(),
            [](const OpProfiler::Row& a, const OpProfiler::Row& b) { return a.total_ms > b.total_ms; });
  return out;
}

// report()'s table: a title line, then the first `top` rows and the rest summed in one.
std::string table(const char* title, const Device& device, int64_t steps, const char* row_name,
                  const std::vector<OpProfiler::Row>& all, size_t top) {
  const double per = static_cast<double>(std::max<int64_t>(steps, 1));
  double total = 0;
  for (const OpProfiler::Row& r : all) total += r.total_ms;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%s on %s over %lld steps: %.3f ms per step\n", title, device.str().c_str(),
                static_cast<long long>(steps), total / per);
  out += line;
  std::snprintf(line, sizeof(line), "  %-44s %10s %12s %7s\n", row_name, "calls/step", "ms/step", "share");
  out += line;
  for (size_t i = 0; i < all.size() && i < top; ++i) {
    const OpProfiler::Row& r = all[i];
    std::snprintf(line, sizeof(line), "  %-44s %10.1f %12.3f %6.1f%%\n", r.label.c_str(),
                  static_cast<double>(r.calls) / per, r.total_ms / per, total > 0 ? 100.0 * r.total_ms / total : 0.0);
    out += line;
  }
  if (all.size() > top) {
    double rest = 0;
    for (size_t i = top; i < all.size(); ++i) rest += all[i].total_ms;
    std::snprintf(line, sizeof(line), "  %-44s %10s %12.3f %6.1f%%\n", "(the other intervals)", "", rest / per,
                  total > 0 ? 100.0 * rest / total : 0.0);
    out += line;
  }
  return out;
}

}  // namespace

std::vector<OpProfiler::Row> OpProfiler::rows() const {
  return sorted_rows(impl_->labels, impl_->label_ms, impl_->label_calls);
}

std::vector<OpProfiler::Row> OpProfiler::module_rows() const {
  return sorted_rows(impl_->module_labels, impl_->module_ms, impl_->module_calls);
}

double OpProfiler::total_ms() const {
  double total = 0;
  for (const Row& r : rows()) total += r.total_ms;
  return total;
}

std::string OpProfiler::report(size_t top) const {
  return table("op profile", impl_->device, steps_, "interval", rows(), top);
}

std::string OpProfiler::module_report(size_t top) const {
  return table("module profile", impl_->device, steps_, "module", module_rows(), top);
}

std::string profile_steps(Device device, int64_t steps, const std::function<void()>& step) {
  OpProfiler profiler(device);
  for (int64_t i = 0; i < steps; ++i) {
    step();
    profiler.step();
  }
  return profiler.report();
}

}  // namespace mt
