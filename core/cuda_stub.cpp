// Built instead of core/cuda/*.cu when nvcc was not found at configure time.
// Every CUDA entry point says so clearly instead of failing obscurely.
#include "core/cuda/dependent_launch.h"
#include "core/cuda_context.h"
#include "core/error.h"
#include "core/kernels.h"

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw mt::DeviceError(std::string(what) +
                        ": mixtrain was built without CUDA support (nvcc was not found when it was configured)");
}
}  // namespace

namespace mt::cuda {

DeviceGuard::DeviceGuard(int) { no_cuda("DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
void set_current_device(int) { no_cuda("set_current_device"); }

bool built_with_cuda() { return false; }
bool is_available() { return false; }
int device_count() { return 0; }
std::string device_name(int) { no_cuda("device_name"); }
int compute_capability(int) { no_cuda("compute_capability"); }
void synchronize_device(int) { no_cuda("synchronize_device"); }

Stream Stream::create(int, Priority) { no_cuda("Stream::create"); }
Stream Stream::wrap(StreamHandle, int) { no_cuda("Stream::wrap"); }
void Stream::synchronize() const { no_cuda("Stream::synchronize"); }
bool Stream::query() const { no_cuda("Stream::query"); }
Stream current_stream(int) { no_cuda("current_stream"); }
void set_current_stream(const Stream&) { no_cuda("set_current_stream"); }
StreamGuard::StreamGuard(const Stream&) { no_cuda("StreamGuard"); }
StreamGuard::~StreamGuard() = default;

Event::Event(int, Timing) { no_cuda("Event"); }
Event::~Event() = default;
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;
void Event::record(const Stream&) { no_cuda("Event::record"); }
void Event::wait_on(const Stream&) const { no_cuda("Event::wait_on"); }
void Event::synchronize() const { no_cuda("Event::synchronize"); }
bool Event::query() const { no_cuda("Event::query"); }
float Event::elapsed_ms(const Event&) const { no_cuda("Event::elapsed_ms"); }

void* allocate(size_t, int, StreamHandle) { no_cuda("allocate"); }
void deallocate(void*, size_t, int, StreamHandle) {}
MemoryStats memory_stats(int) { no_cuda("memory_stats"); }
void reset_peak_memory(int) { no_cuda("reset_peak_memory"); }
void empty_cache(int) { no_cuda("empty_cache"); }
void copy_bytes(void*, const void*, size_t, CopyKind, int) { no_cuda("copy to or from a CUDA device"); }

bool capturing() { return false; }
bool dependent_launch_enabled(int) { return false; }
DependentLaunchScope::DependentLaunchScope() = default;
DependentLaunchScope::~DependentLaunchScope() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
void Graph::capture(const Stream&, const std::function<void()>&) { no_cuda("Graph::capture"); }
void Graph::replay(const Stream&) const { no_cuda("Graph::replay"); }
void Graph::write_dot(const std::string&) const { no_cuda("Graph::write_dot"); }
std::string Graph::observe(const Stream&, const std::function<void()>&) {
  no_cuda("Graph::observe");
  return {};
}
void Graph::reset() {}

}  // namespace mt::cuda

namespace mt::kernels {
void copy_cuda(const Tensor&, const Tensor&) { no_cuda("copy"); }
void fill_cuda(const Tensor&, double) { no_cuda("fill_"); }
void arange_cuda(const Tensor&, double, double) { no_cuda("arange"); }
void accumulate_cuda(const Tensor&, const Tensor&) { no_cuda("accumulate_"); }
void random_cuda(const Tensor&, Distribution, double, double, uint64_t, uint64_t) { no_cuda("rand"); }
}  // namespace mt::kernels
