// The narrow interface through which the rest of mixtrain talks to the CUDA
// runtime. It needs no CUDA header, so plain C++ files can use it; in a build
// without nvcc every function here (except is_available/device_count) throws
// DeviceError saying so.
//
// Streams: each device has one current compute stream per thread (by default a
// non-blocking stream mixtrain creates, never the legacy null stream, so that
// work can be captured in CUDA Graphs). StreamGuard changes it for a scope.
// Memory: the stream-ordered allocator (cudaMallocAsync on the device's default
// pool, release threshold = unlimited so freed blocks stay cached).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

struct CUstream_st;     // cudaStream_t is CUstream_st*
struct CUevent_st;      // cudaEvent_t is CUevent_st*
struct CUgraph_st;      // cudaGraph_t is CUgraph_st*
struct CUgraphExec_st;  // cudaGraphExec_t is CUgraphExec_st*

namespace mt::cuda {

using StreamHandle = CUstream_st*;
using EventHandle = CUevent_st*;

bool built_with_cuda();
bool is_available();  // built with CUDA and at least one device visible
int device_count();
std::string device_name(int device);
int compute_capability(int device);   // e.g. 90 for sm_90
void synchronize_device(int device);  // tests and benchmarks only; never on a hot path

// Makes `device` the current CUDA device for a scope, then restores the previous one.
// Makes `device` the calling thread's current device for good: a process that owns one GPU
// (a data-parallel rank) calls it once, since copies and kernels go to that device's streams.
void set_current_device(int device);

class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// ---- streams ----
// A stream: owning (created by Stream::create) or a non-owning reference.
class Stream {
 public:
  enum class Priority { normal, high };
  Stream() = default;
  static Stream create(int device, Priority priority = Priority::normal);
  static Stream wrap(StreamHandle handle, int device);  // non-owning

  StreamHandle handle() const { return handle_.get(); }
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all work submitted so far has finished
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle() == b.handle(); }

 private:
  std::shared_ptr<CUstream_st> handle_;
  int device_ = 0;
};

Stream current_stream(int device);
void set_current_stream(const Stream& stream);

// Makes `stream` current on its device for the scope, then restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// An event, for cross-stream dependencies and timing. Move-only.
class Event {
 public:
  enum class Timing { disabled, enabled };
  explicit Event(int device, Timing timing = Timing::disabled);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void wait_on(const Stream& stream) const;  // `stream` waits for this event (no host sync)
  void synchronize() const;
  bool query() const;
  float elapsed_ms(const Event& end) const;  // both recorded with Timing::enabled
  EventHandle handle() const { return handle_; }

 private:
  EventHandle handle_ = nullptr;
  int device_ = 0;
};

// ---- memory ----
struct MemoryStats {
  size_t allocated = 0;       // bytes in live tensors
  size_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
  size_t reserved = 0;        // bytes the pool holds from the driver (live + cached)
  size_t device_free = 0;     // as cudaMemGetInfo reports
  size_t device_total = 0;
};

// Allocates on `stream` (stream-ordered). Throws OutOfMemoryError naming the
// request, the device and the figures above.
void* allocate(size_t nbytes, int device, StreamHandle stream);
void deallocate(void* ptr, size_t nbytes, int device, StreamHandle stream);
MemoryStats memory_stats(int device);
void reset_peak_memory(int device);
void empty_cache(int device);  // return cached blocks to the driver

// Copies bytes between host and device or device and device, ordered on the
// current stream of the device involved. A copy to the host waits for it.
enum class CopyKind { host_to_device, device_to_host, device_to_device };
void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);

std::string format_bytes(size_t nbytes);  // "1.50 GiB"

// ---- CUDA Graphs ----
// Work recorded once on a stream and replayed with one launch: a step of many small
// kernels costs one launch instead of one per kernel.
//
// capture() runs `body` once under stream capture (thread-local mode): its host code runs,
// its device work on `stream` is recorded, not executed. Everything the body allocates it
// must also free (intermediates become the graph's own memory, allocated and freed by each
// replay at the same addresses), and it must not free a tensor made before the capture
// (each replay would free it again). Results go into tensors made beforehand
// (`loss_out.copy_(loss)`). capture() throws, saying which rule was broken, when the body
// kept or freed such tensors, synchronised with the host (item(), a copy to the host) or
// left work on another stream unjoined; nothing is captured then, and nothing of the body runs
// on the device (a graph that kept memory or read freed host memory must not run even once).
// Whether this thread is capturing a Graph (host-side checks that would synchronise wait).
bool capturing();

// While one exists on this thread, the allocations a Graph capture records on its stream are
// kept beside the stream's chain of kernels, so that a kernel launched right after them as a
// programmatic dependent (core/cuda/dependent_launch.cuh) may still start while the kernel
// before them runs. Ops whose kernels are launched so hold one over the allocations they make
// before launching. Elsewhere an allocation stays in the chain: kept beside it, it would give the
// next kernel a second dependency, which slows plain kernels replayed from a graph and gains
// nothing. A free captured between two kernels still makes the second wait.
class DependentLaunchScope {
 public:
  DependentLaunchScope();
  ~DependentLaunchScope();
  DependentLaunchScope(const DependentLaunchScope&) = delete;
  DependentLaunchScope& operator=(const DependentLaunchScope&) = delete;
};

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void capture(const Stream& stream, const std::function<void()>& body);
  // Runs `body` eagerly on `stream` while the allocator keeps the ledger a capture would, and
  // returns what would make capture() refuse it (tensors kept, or older ones freed), or "".
  // A step that fails this check is refused while it still runs (a refused capture runs nothing).
  static std::string observe(const Stream& stream, const std::function<void()>& body);
  // The recorded work, enqueued on `stream`. Library workspaces (cuBLASLt's, the norms' partial
  // rows) are those of the stream it was captured on: replay it there, or while nothing else runs
  // on that stream.
  void replay(const Stream& stream) const;
  bool captured() const { return exec_ != nullptr; }
  size_t nodes() const { return nodes_; }  // kernels, copies, allocations... in the graph
  // Writes the graph as Graphviz dot, each node with its kernel's name and launch shape
  // (cudaGraphDebugDotPrint, verbose): what a replay runs, node by node.
  void write_dot(const std::string& path) const;

 private:
  void reset();
  CUgraph_st* graph_ = nullptr;
  CUgraphExec_st* exec_ = nullptr;
  size_t nodes_ = 0;
};

}  // namespace mt::cuda
