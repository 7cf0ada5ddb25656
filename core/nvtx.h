// Named ranges of host time, for Nsight Systems (NVTX) and for a host-side trace file.
//
//   { mt::nvtx::Range range("optimizer");  opt.step(); }   // one range, closed at the brace
//
// Ranges are off by default. MT_NVTX=1 in the environment turns them on at start (any other
// value, or none, leaves them off), set_enabled() at any time. While on, each Range pushes an
// NVTX range in the "mixtrain" domain (nsys profile -t cuda,nvtx shows it on the timeline, over the
// kernels its launches queued) and, while a host trace records, adds a complete event to it.
// A host trace starts with MT_TRACE=FILE.json in the environment or start_trace(path), and is
// written as Chrome trace-event JSON (Perfetto, chrome://tracing) by stop_trace() or at process
// exit; trace_summary() tabulates it for machines without nsys. docs/profiling.md has the commands.
//
// Every time here is host time. On CUDA a launch returns before its kernel runs, so a range
// measures the launches made inside it, not the device work; nsys draws the kernels under the
// ranges that launched them, and OpProfiler (autograd/profiler.h) measures device time.
//
// The cost when off: a Range's constructor reads one relaxed atomic flag and branches, its
// destructor branches on a member; nothing is allocated and no string is built. So a range name
// must already exist: a literal, or a std::string made once and kept (a module's path, a DDP
// bucket's label) that outlives the Range. A temporary std::string is refused at compile time.
// NVTX calls are compiled in where the CUDA toolkit's NVTX 3 headers were found and the CMake
// option MT_NVTX is on (the default); otherwise ranges feed the host trace alone (compiled_in()).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace mt::nvtx {

namespace detail {
extern std::atomic<bool> g_enabled;    // ranges on
extern std::atomic<bool> g_recording;  // a host trace records
}  // namespace detail

// Are ranges on? One relaxed load: callers may ask before building anything.
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on);
// Were the NVTX calls compiled in (MT_NVTX=ON and the toolkit's headers found)?
bool compiled_in();

class Range {
 public:
  explicit Range(const char* name) {
    if (enabled()) begin(name);
  }
  explicit Range(const std::string& name) : Range(name.c_str()) {}
  // A temporary's text would be gone before the range ends.
  explicit Range(std::string&& name) = delete;
  ~Range() {
    if (name_ != nullptr) end();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  void begin(const char* name);
  void end();
  const char* name_ = nullptr;  // set while open
  int64_t start_ns_ = -1;       // steady-clock start, when a host trace recorded the opening
};

// ---- host trace ----
// Starts recording every range's (name, thread, start, end) and turns ranges on until
// stop_trace(). A "%p" in `path` becomes the process id (one file per rank under mpirun). Throws
// if a trace already records, or if the path's directory does not exist.
void start_trace(const std::string& path);
// Writes the trace atomically (core/atomic_file.h) and stops recording; ranges go back to the
// state they had before start_trace. Does nothing when no trace records. A trace still recording
// at process exit is written then.
void stop_trace();
bool tracing();
// Per range name over the current or last trace: count, total ms and mean ms, by total time
// (nested ranges count in their own row and in their parents').
std::string trace_summary();

}  // namespace mt::nvtx
