#include "core/nvtx.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

#if MT_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace mt::nvtx {

namespace detail {
std::atomic<bool> g_enabled{false};
std::atomic<bool> g_recording{false};
}  // namespace detail

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if MT_WITH_NVTX
nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t handle = nvtxDomainCreateA("mixtrain");
  return handle;
}
#endif

// A trace of a long run would grow without bound; past this many events (24 bytes each) further
// ones are counted but not kept, while trace_summary() still counts every range.
constexpr size_t kMaxEvents = size_t{4} << 20;

struct Event {
  uint32_t name;
  int32_t tid;
  int64_t start_ns, end_ns;
};

struct Totals {
  int64_t count = 0;
  int64_t ns = 0;
};

struct Trace {
  std::mutex mutex;
  bool recording = false;
  bool enabled_before = false;
  bool exit_hook = false;
  std::string path;
  int64_t start_ns = 0, end_ns = 0;
  std::deque<std::string> names;  // a deque: the map's views into it stay valid as it grows
  std::unordered_map<std::string_view, uint32_t> name_ids;
  std::vector<Totals> totals;  // per name
  std::vector<Event> events;
  uint64_t dropped = 0;

  uint32_t intern(std::string_view name) {
    auto it = name_ids.find(name);
    if (it != name_ids.end()) return it->second;
    names.emplace_back(name);
    totals.emplace_back();
    return name_ids.emplace(names.back(), static_cast<uint32_t>(names.size() - 1)).first->second;
  }
};

// Never destroyed: ranges may still end on other threads while the process exits.
Trace& trace() {
  static Trace* t = new Trace;
  return *t;
}

int32_t thread_id() {
  thread_local const int32_t tid = static_cast<int32_t>(::syscall(SYS_gettid));
  return tid;
}

void record(const char* name, int64_t start_ns, int64_t end_ns) {
  const int32_t tid = thread_id();
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mutex);
  // A range opened before this trace started belongs to no trace.
  if (!t.recording || start_ns < t.start_ns) return;
  const uint32_t id = t.intern(name);
  t.totals[id].count += 1;
  t.totals[id].ns += end_ns - start_ns;
  if (t.events.size() < kMaxEvents) {
    t.events.push_back(Event{id, tid, start_ns, end_ns});
  } else {
    ++t.dropped;
  }
}

// Microseconds with three decimals, from integer nanoseconds (exact).
void append_us(std::string& out, int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  out += text;
}

// Chrome trace-event JSON: complete ("X") events, parents before their children.
std::string trace_json(Trace& t) {
  std::sort(t.events.begin(), t.events.end(), [](const Event& a, const Event& b) {
    if (a.tid != b.tid) return a.tid < b.tid;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.end_ns > b.end_ns;
  });
  std::vector<std::string> quoted;
  quoted.reserve(t.names.size());
  for (const std::string& name : t.names) {
    quoted.push_back(nlohmann::json(name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  const std::string pid = std::to_string(::getpid());
  std::string out;
  out.reserve(128 + t.events.size() * 80);
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"mixtrain\",\"clock\":\"host steady clock, ";
  out += "microseconds from the trace's start\",\"dropped_events\":" + std::to_string(t.dropped) + "},\n";
  out += "\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
         ",\"tid\":0,\"args\":{\"name\":\"mixtrain\"}}";
  for (const Event& e : t.events) {
    out += ",\n{\"name\":";
    out += quoted[e.name];
    out += ",\"ph\":\"X\",\"ts\":";
    append_us(out, e.start_ns - t.start_ns);
    out += ",\"dur\":";
    append_us(out, e.end_ns - e.start_ns);
    out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.tid) + "}";
  }
  out += "\n]}\n";
  return out;
}

void write_at_exit() {
  try {
    stop_trace();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixtrain: the host trace was not written at exit: %s\n", e.what());
  }
}

std::string expand_pid(std::string path) {
  const std::string pid = std::to_string(::getpid());
  for (size_t at = path.find("%p"); at != std::string::npos; at = path.find("%p", at + pid.size())) {
    path.replace(at, 2, pid);
  }
  return path;
}

// MT_NVTX and MT_TRACE, read once as the library loads.
struct FromEnvironment {
  FromEnvironment() {
    const char* nvtx = std::getenv("MT_NVTX");
    if (nvtx != nullptr && std::string_view(nvtx) == "1") set_enabled(true);
    const char* path = std::getenv("MT_TRACE");
    if (path == nullptr || *path == '\0') return;
    try {
      start_trace(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mixtrain: MT_TRACE: %s; no host trace will be written\n", e.what());
    }
  }
};
const FromEnvironment g_from_environment;

}  // namespace

void set_enabled(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }

bool compiled_in() {
#if MT_WITH_NVTX
  return true;
#else
  return false;
#endif
}

void Range::begin(const char* name) {
  name_ = name;
#if MT_WITH_NVTX
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  nvtxDomainRangePushEx(domain(), &attributes);
#endif
  if (detail::g_recording.load(std::memory_order_relaxed)) start_ns_ = now_ns();
}

void Range::end() {
  if (start_ns_ >= 0) record(name_, start_ns_, now_ns());
#if MT_WITH_NVTX
  nvtxDomainRangePop(domain());
#endif
}

void start_trace(const std::string& path) {
  MT_CHECK(!path.empty(), "start_trace: the trace file's path is empty");
  const std::string file = expand_pid(path);
  std::filesystem::path dir = std::filesystem::path(file).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code error;
  MT_CHECK_T(FileError, std::filesystem::is_directory(dir, error), "start_trace: ", file, ": the directory ",
             dir.string(), " does not exist");
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mutex);
  MT_CHECK(!t.recording, "start_trace: a host trace already records to ", t.path, "; stop_trace() it first");
  t.path = file;
  t.names.clear();
  t.name_ids.clear();
  t.totals.clear();
  t.events.clear();
  t.dropped = 0;
  t.start_ns = now_ns();
  t.end_ns = 0;
  t.enabled_before = enabled();
  t.recording = true;
  detail::g_recording.store(true, std::memory_order_relaxed);
  set_enabled(true);
  if (!t.exit_hook) {
    t.exit_hook = true;
    std::atexit(write_at_exit);
  }
}

void stop_trace() {
  std::string path, content;
  {
    Trace& t = trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (!t.recording) return;
    t.recording = false;
    t.end_ns = now_ns();
    detail::g_recording.store(false, std::memory_order_relaxed);
    set_enabled(t.enabled_before);
    content = trace_json(t);
    path = t.path;
    t.events = {};  // the totals stay for trace_summary()
  }
  write_file_atomically(path, "trace file", content);
}

bool tracing() { return detail::g_recording.load(std::memory_order_relaxed); }

std::string trace_summary() {
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (t.path.empty()) return "no host trace has recorded (MT_TRACE=FILE.json, or mt::nvtx::start_trace)\n";
  std::vector<size_t> order(t.names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.totals[a].ns > t.totals[b].ns; });
  const int64_t span_ns = (t.recording ? now_ns() : t.end_ns) - t.start_ns;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "host ranges of %s over %.3f ms%s (host time: on CUDA, launches are asynchronous)\n", t.path.c_str(),
                static_cast<double>(span_ns) / 1e6, t.recording ? ", still recording" : "");
  out += line;
  std::snprintf(line, sizeof(line), "  %-48s %8s %12s %10s\n", "range", "count", "total ms", "mean ms");
  out += line;
  for (size_t i : order) {
    const Totals& s = t.totals[i];
    const double total_ms = static_cast<double>(s.ns) / 1e6;
    std::snprintf(line, sizeof(line), "  %-48s %8lld %12.3f %10.3f\n", t.names[i].c_str(),
                  static_cast<long long>(s.count), total_ms,
                  total_ms / static_cast<double>(std::max<int64_t>(s.count, 1)));
    out += line;
  }
  if (t.dropped > 0) {
    std::snprintf(line, sizeof(line), "  (%llu events past the first %zu were counted here but left out of the file)\n",
                  static_cast<unsigned long long>(t.dropped), kMaxEvents);
    out += line;
  }
  return out;
}

}  // namespace mt::nvtx
