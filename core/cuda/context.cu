// Devices, streams, events and the stream-ordered allocator (core/cuda_context.h).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "core/cuda/capture_ledger.h"
#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace mt::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::once_flag init;
  Stream default_stream;
  cudaMemPool_t pool = nullptr;
  std::atomic<size_t> allocated{0};
  std::atomic<size_t> peak{0};
};

DeviceState& state(int device) {
  // Never destroyed: tensors freed during static destruction still find their pool.
  static auto* states = new DeviceState[kMaxDevices];
  MT_CHECK_T(DeviceError, device >= 0 && device < device_count(), "cuda:", device, " does not exist (", device_count(),
             " CUDA device(s) visible)");
  DeviceState& s = states[device];
  std::call_once(s.init, [&] {
    DeviceGuard guard(device);
    cudaStream_t handle = nullptr;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking));
    s.default_stream = Stream::wrap(handle, device);  // lives for the process
    MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&s.pool, device));
    // Keep freed blocks cached in the pool instead of returning them to the driver at
    // every synchronisation: the caching behaviour a training loop needs.
    uint64_t threshold = std::numeric_limits<uint64_t>::max();
    MT_CUDA_CHECK(cudaMemPoolSetAttribute(s.pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
  return s;
}

std::vector<Stream>& thread_current_streams() {
  thread_local std::vector<Stream> current(kMaxDevices);
  return current;
}

size_t pool_reserved(cudaMemPool_t pool) {
  uint64_t reserved = 0;
  MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  return static_cast<size_t>(reserved);
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  MT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) MT_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() { cudaSetDevice(previous_); }

void set_current_device(int device) { MT_CUDA_CHECK(cudaSetDevice(device)); }

bool built_with_cuda() { return true; }

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: a CPU-only machine, not an error
      return 0;
    }
    return n;
  }();
  return count;
}

bool is_available() { return device_count() > 0; }

std::string device_name(int device) {
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int compute_capability(int device) {
  int major = 0, minor = 0;
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// The compute capability is read once per device: launches ask on every call. Devices past
// kMaxDevices are asked each time.
bool dependent_launch_enabled(int device) {
  if (!dependent_launch_requested()) return false;
  static std::atomic<int> known[kMaxDevices] = {};  // 0: not asked yet, 1: no, 2: yes
  if (device < 0 || device >= kMaxDevices) return compute_capability(device) >= 90;
  int state = known[device].load(std::memory_order_relaxed);
  if (state == 0) {
    state = compute_capability(device) >= 90 ? 2 : 1;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state == 2;
}

void synchronize_device(int device) {
  DeviceGuard guard(device);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- streams ----

Stream Stream::create(int device, Priority priority) {
  state(device);
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t handle = nullptr;
  MT_CUDA_CHECK(
      cudaStreamCreateWithPriority(&handle, cudaStreamNonBlocking, priority == Priority::high ? greatest : least));
  Stream s;
  s.handle_ = std::shared_ptr<CUstream_st>(handle, [](cudaStream_t h) { cudaStreamDestroy(h); });
  s.device_ = device;
  return s;
}

Stream Stream::wrap(StreamHandle handle, int device) {
  Stream s;
  s.handle_ = std::shared_ptr<CUstream_st>(handle, [](cudaStream_t) {});
  s.device_ = device;
  return s;
}

void Stream::synchronize() const { MT_CUDA_CHECK(cudaStreamSynchronize(handle())); }

bool Stream::query() const {
  const cudaError_t status = cudaStreamQuery(handle());
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(status);
  return true;
}

Stream current_stream(int device) {
  DeviceState& s = state(device);
  const Stream& current = thread_current_streams()[static_cast<size_t>(device)];
  return current.handle() ? current : s.default_stream;
}

void set_current_stream(const Stream& stream) {
  state(stream.device());
  thread_current_streams()[static_cast<size_t>(stream.device())] = stream;
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() { thread_current_streams()[static_cast<size_t>(previous_.device())] = previous_; }

// ---- events ----

Event::Event(int device, Timing timing) : device_(device) {
  state(device);
  DeviceGuard guard(device);
  MT_CUDA_CHECK(
      cudaEventCreateWithFlags(&handle_, timing == Timing::enabled ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (handle_) cudaEventDestroy(handle_);
}

Event::Event(Event&& other) noexcept : handle_(other.handle_), device_(other.device_) { other.handle_ = nullptr; }

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_) cudaEventDestroy(handle_);
    handle_ = other.handle_;
    device_ = other.device_;
    other.handle_ = nullptr;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  MT_CHECK_T(DeviceError, stream.device() == device_, "Event::record: event of cuda:", device_,
             " recorded on a stream of cuda:", stream.device());
  MT_CUDA_CHECK(cudaEventRecord(handle_, stream.handle()));
}

void Event::wait_on(const Stream& stream) const { MT_CUDA_CHECK(cudaStreamWaitEvent(stream.handle(), handle_, 0)); }

void Event::synchronize() const { MT_CUDA_CHECK(cudaEventSynchronize(handle_)); }

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(handle_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0.0f;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, handle_, end.handle_));
  return ms;
}

// ---- memory ----

namespace {
thread_local internal::CaptureLedger* t_capture_ledger = nullptr;

std::mutex& poisoned_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::unordered_set<void*>& poisoned() {
  static auto* set = new std::unordered_set<void*>();  // never destroyed: frees may run at exit
  return *set;
}
std::atomic<size_t> poisoned_count{0};  // lets every other free skip the lock
}  // namespace

void internal::set_capture_ledger(internal::CaptureLedger* ledger) { t_capture_ledger = ledger; }

bool capturing() { return t_capture_ledger != nullptr && t_capture_ledger->capturing; }

namespace {
thread_local int t_dependent_launch_scopes = 0;
}  // namespace

DependentLaunchScope::DependentLaunchScope() { ++t_dependent_launch_scopes; }
DependentLaunchScope::~DependentLaunchScope() { --t_dependent_launch_scopes; }

// ---- a captured stream's kernels kept adjacent ----
// Captured, cudaMallocAsync and cudaFreeAsync become memory nodes in the stream's chain, between
// the kernel before them and the kernel after, and a programmatic dependent launch
// (core/cuda/dependent_launch.cuh) does not cross such a node: the kernel after it then waits for
// the one before to end and flush, as if launched plainly, and the early start the dependent
// launch exists for is lost (tests/core/test_dependent_launch.cu times both cases). So on the
// capturing stream the allocator keeps its nodes beside the chain where a dependent launch may
// follow. A free node
// follows the stream's nodes, as captured, and the stream goes on from those nodes, not from it;
// the next allocation is ordered after it. Inside a DependentLaunchScope an allocation node
// follows only the free nodes set aside whose memory no running kernel may still use (the stream
// has moved past the nodes they followed), and the stream goes on from its nodes and the
// allocation; elsewhere an allocation follows the stream's nodes and every free set aside, and
// the stream goes on from it, as captured. The graph still orders every free after the last use
// of its memory and every allocation after the frees whose memory it may take, so its memory is
// reused as before (the same high-water mark in that test), except memory freed since the last
// kernel inside a scope. (The kernel right after a free set aside still waits for the end of the
// one before. Frees are set aside rather than captured in the chain because there their nodes
// would leave the allocations in a scope no memory to reuse: a graph would keep every buffer it
// allocates.)
namespace {

struct CaptureDependencies {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> edges;  // parallel to nodes
};

// The nodes the next node captured on `stream` would follow; false where the stream is not
// capturing (an invalidated capture refuses the calls that follow and reports it itself).
bool capture_dependencies(cudaStream_t stream, CaptureDependencies* out) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* nodes = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t count = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &nodes, &edges, &count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (status != cudaStreamCaptureStatusActive) return false;
  out->nodes.assign(nodes, nodes + count);
  if (edges != nullptr) {
    out->edges.assign(edges, edges + count);
  } else {
    out->edges.assign(count, cudaGraphEdgeData{});
  }
  return true;
}

bool set_capture_dependencies(cudaStream_t stream, CaptureDependencies& deps) {
  if (cudaStreamUpdateCaptureDependencies(stream, deps.nodes.data(), deps.edges.data(), deps.nodes.size(),
                                          cudaStreamSetCaptureDependencies) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

// Whether this allocation or free on `stream` is captured into the chain of kernels that
// dependent launches may overlap: the capturing stream itself, on a device where they are on.
bool chain_capture(cudaStream_t stream, int device) {
  return capturing() && stream == t_capture_ledger->stream && dependent_launch_enabled(device);
}

cudaError_t malloc_beside_chain(void** ptr, size_t nbytes, cudaStream_t stream, internal::CaptureLedger& ledger) {
  CaptureDependencies chain;
  if (!capture_dependencies(stream, &chain)) return cudaMallocAsync(ptr, nbytes, stream);
  CaptureDependencies frees;  // the set-aside frees whose memory no running kernel uses
  std::vector<internal::CaptureLedger::AsideFree> still_aside;
  for (internal::CaptureLedger::AsideFree& f : ledger.aside_frees) {
    const bool behind_the_chain = std::none_of(f.after.begin(), f.after.end(), [&](cudaGraphNode_t n) {
      return std::find(chain.nodes.begin(), chain.nodes.end(), n) != chain.nodes.end();
    });
    if (behind_the_chain) {
      frees.nodes.push_back(f.node);
      frees.edges.push_back(cudaGraphEdgeData{});
    } else {
      still_aside.push_back(std::move(f));
    }
  }
  ledger.aside_frees.swap(still_aside);
  if (!set_capture_dependencies(stream, frees)) return cudaMallocAsync(ptr, nbytes, stream);
  const cudaError_t status = cudaMallocAsync(ptr, nbytes, stream);
  CaptureDependencies allocation;
  if (status == cudaSuccess && capture_dependencies(stream, &allocation)) {
    chain.nodes.insert(chain.nodes.end(), allocation.nodes.begin(), allocation.nodes.end());
    chain.edges.insert(chain.edges.end(), allocation.edges.begin(), allocation.edges.end());
  }
  set_capture_dependencies(stream, chain);
  return status;
}

// An allocation in the chain, ordered after every free set aside (all of them: the kernel after
// it waits for the one before anyway).
cudaError_t malloc_after_aside_frees(void** ptr, size_t nbytes, cudaStream_t stream, internal::CaptureLedger& ledger) {
  CaptureDependencies deps;
  if (ledger.aside_frees.empty() || !capture_dependencies(stream, &deps)) return cudaMallocAsync(ptr, nbytes, stream);
  for (const internal::CaptureLedger::AsideFree& f : ledger.aside_frees) {
    deps.nodes.push_back(f.node);
    deps.edges.push_back(cudaGraphEdgeData{});
  }
  ledger.aside_frees.clear();
  set_capture_dependencies(stream, deps);
  return cudaMallocAsync(ptr, nbytes, stream);
}

cudaError_t free_beside_chain(void* ptr, cudaStream_t stream, internal::CaptureLedger& ledger) {
  CaptureDependencies chain;
  if (!capture_dependencies(stream, &chain)) return cudaFreeAsync(ptr, stream);
  const cudaError_t status = cudaFreeAsync(ptr, stream);
  CaptureDependencies freed;
  if (status == cudaSuccess && capture_dependencies(stream, &freed) && freed.nodes.size() == 1) {
    ledger.aside_frees.push_back({freed.nodes[0], chain.nodes});
    set_capture_dependencies(stream, chain);
  }
  return status;
}

}  // namespace

void internal::free_deferred(internal::CaptureLedger& ledger) {
  for (const internal::CaptureLedger::DeferredFree& f : ledger.deferred) {
    if (cudaFreeAsync(f.ptr, f.stream) != cudaSuccess) cudaGetLastError();  // freeing must not throw
  }
  ledger.deferred.clear();
}

void internal::poison(const internal::CaptureLedger& ledger) {
  std::lock_guard<std::mutex> lock(poisoned_mutex());
  for (const auto& entry : ledger.live) poisoned().insert(entry.first);
  poisoned_count.store(poisoned().size());
}

void* allocate(size_t nbytes, int device, StreamHandle stream) {
  DeviceState& s = state(device);
  DeviceGuard guard(device);
  void* ptr = nullptr;
  cudaError_t status = cudaSuccess;
  if (!chain_capture(stream, device)) {
    status = cudaMallocAsync(&ptr, nbytes, stream);
  } else if (t_dependent_launch_scopes > 0) {
    status = malloc_beside_chain(&ptr, nbytes, stream, *t_capture_ledger);
  } else {
    status = malloc_after_aside_frees(&ptr, nbytes, stream, *t_capture_ledger);
  }
  if (status == cudaErrorMemoryAllocation && !capturing()) {
    // The pool may hold blocks freed on other streams: return them to the driver
    // and try once more before giving up (not while capturing: that would synchronise).
    cudaGetLastError();
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
    status = cudaMallocAsync(&ptr, nbytes, stream);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    const MemoryStats stats = memory_stats(device);
    throw OutOfMemoryError(detail::str_cat(
        "CUDA out of memory: tried to allocate ", format_bytes(nbytes), " on cuda:", device, " (", device_name(device),
        "); mixtrain has ", format_bytes(stats.allocated), " allocated, ", format_bytes(stats.reserved),
        " reserved, peak ", format_bytes(stats.peak_allocated), "; the device has ", format_bytes(stats.device_free),
        " free of ", format_bytes(stats.device_total)));
  }
  MT_CUDA_CHECK(status);
  if (t_capture_ledger != nullptr) {
    if (stream == t_capture_ledger->stream) {
      t_capture_ledger->live.emplace(ptr, nbytes);
    } else {
      ++t_capture_ledger->other_stream_allocations;
    }
  }
  const size_t now = s.allocated.fetch_add(nbytes) + nbytes;
  size_t peak = s.peak.load();
  while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
  }
  return ptr;
}

void deallocate(void* ptr, size_t nbytes, int device, StreamHandle stream) {
  DeviceState& s = state(device);
  DeviceGuard guard(device);
  s.allocated.fetch_sub(nbytes);
  // First: an address a failed capture handed out was never backed, whoever frees it and when.
  if (poisoned_count.load(std::memory_order_relaxed) > 0) {
    std::lock_guard<std::mutex> lock(poisoned_mutex());
    const bool never_backed = poisoned().erase(ptr) > 0;
    poisoned_count.store(poisoned().size());
    if (never_backed) return;  // nothing to free
  }
  if (t_capture_ledger != nullptr) {
    if (t_capture_ledger->live.erase(ptr) == 0 && stream == t_capture_ledger->stream) {
      // Older memory: a graph may free only its own allocations; freed once the capture ends.
      t_capture_ledger->deferred.push_back({ptr, nbytes, stream});
      return;
    }
    // This runs in destructors and must not throw; a capture the step invalidated (a host
    // synchronisation) refuses every call until it ends, and reports that itself.
    const cudaError_t status =
        chain_capture(stream, device) ? free_beside_chain(ptr, stream, *t_capture_ledger) : cudaFreeAsync(ptr, stream);
    if (status != cudaSuccess) cudaGetLastError();
    return;
  }
  MT_CUDA_CHECK(cudaFreeAsync(ptr, stream));
}

MemoryStats memory_stats(int device) {
  DeviceState& s = state(device);
  DeviceGuard guard(device);
  MemoryStats stats;
  stats.allocated = s.allocated.load();
  stats.peak_allocated = s.peak.load();
  stats.reserved = pool_reserved(s.pool);
  MT_CUDA_CHECK(cudaMemGetInfo(&stats.device_free, &stats.device_total));
  return stats;
}

void reset_peak_memory(int device) {
  DeviceState& s = state(device);
  s.peak.store(s.allocated.load());
}

void empty_cache(int device) {
  DeviceState& s = state(device);
  DeviceGuard guard(device);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  MT_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
}

void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  if (nbytes == 0) return;
  // A graph would record the host address and read it again at every replay, long after
  // the host buffer (a temporary, mostly) is gone: silently wrong data, so refused.
  if (kind == CopyKind::host_to_device && t_capture_ledger != nullptr) {
    MT_CHECK(!capturing(), "a copy of ", format_bytes(nbytes), " from host memory to cuda:", device,
             " inside a CUDA Graph capture: a replay would read that host memory again, after it is gone. Make "
             "the device tensor before the capture (x.copy_(batch) between replays), or on the device (arange, "
             "full)");
    ++t_capture_ledger->host_copies;  // an observed step: reported when it ends
  }
  DeviceGuard guard(device);
  const Stream stream = current_stream(device);
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, stream.handle()));
  // The host buffer of a device-to-host copy is read right after we return.
  if (kind == CopyKind::device_to_host) stream.synchronize();
}

}  // namespace mt::cuda
