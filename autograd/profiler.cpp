#include "autograd/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "core/cuda_context.h"
#include "core/error.h"

namespace mt {

namespace {
std::atomic<OpProfiler*> g_active{nullptr};
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
  std::vector<cuda::Event> events;  // events[i] belongs to open mark i (pooled)
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

  void add_mark(const std::string& label) {
    std::lock_guard<std::mutex> lock(mutex);
    const size_t i = open_labels.size();
    open_labels.push_back(intern(label));
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
    }
    open_labels = {open_labels[n - 1]};
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
  impl_->add_mark("start");
}

OpProfiler::~OpProfiler() { g_active.store(nullptr); }

bool OpProfiler::active() { return g_active.load(std::memory_order_relaxed) != nullptr; }

void OpProfiler::mark(const std::string& label) {
  OpProfiler* p = g_active.load(std::memory_order_relaxed);
  if (p != nullptr) p->impl_->add_mark(label);
}

void OpProfiler::step() {
  impl_->add_mark("after backward");
  impl_->close_step();
  ++steps_;
}

std::vector<OpProfiler::Row> OpProfiler::rows() const {
  std::vector<Row> out;
  for (size_t i = 0; i < impl_->labels.size(); ++i) {
    if (impl_->label_calls[i] > 0) out.push_back(Row{impl_->labels[i], impl_->label_ms[i], impl_->label_calls[i]});
  }
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.total_ms > b.total_ms; });
  return out;
}

double OpProfiler::total_ms() const {
  double total = 0;
  for (const Row& r : rows()) total += r.total_ms;
  return total;
}

std::string OpProfiler::report(size_t top) const {
  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  const double total = total_ms();
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "op profile on %s over %lld steps: %.3f ms per step\n", impl_->device.str().c_str(),
                static_cast<long long>(steps_), total / steps);
  out += line;
  std::snprintf(line, sizeof(line), "  %-44s %10s %12s %7s\n", "interval", "calls/step", "ms/step", "share");
  out += line;
  const std::vector<Row> all = rows();
  for (size_t i = 0; i < all.size() && i < top; ++i) {
    const Row& r = all[i];
    std::snprintf(line, sizeof(line), "  %-44s %10.1f %12.3f %6.1f%%\n", r.label.c_str(),
                  static_cast<double>(r.calls) / steps, r.total_ms / steps,
                  total > 0 ? 100.0 * r.total_ms / total : 0.0);
    out += line;
  }
  if (all.size() > top) {
    double rest = 0;
    for (size_t i = top; i < all.size(); ++i) rest += all[i].total_ms;
    std::snprintf(line, sizeof(line), "  %-44s %10s %12.3f %6.1f%%\n", "(the other intervals)", "", rest / steps,
                  total > 0 ? 100.0 * rest / total : 0.0);
    out += line;
  }
  return out;
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
