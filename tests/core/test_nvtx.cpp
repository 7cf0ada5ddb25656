// core/nvtx.h: ranges are off unless asked for, a host trace is valid trace-event JSON with each
// range inside the one that was open around it, and MT_NVTX / MT_TRACE are read at start.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/nvtx.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// A temporary string's text would be gone before its range ends: refused at compile time.
static_assert(!std::is_constructible_v<nvtx::Range, std::string>);
static_assert(std::is_constructible_v<nvtx::Range, const std::string&>);
static_assert(std::is_constructible_v<nvtx::Range, const char*>);
static_assert(!std::is_copy_constructible_v<nvtx::Range>);

std::string scratch_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mt_nvtx_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

struct Event {
  std::string name;
  double ts, dur;
  int64_t tid;
};

// The complete events of a trace file, after checking each has the fields a viewer needs.
std::vector<Event> read_events(const std::string& path) {
  const nlohmann::json trace = nlohmann::json::parse(read_bytes(path));  // throws on malformed JSON
  std::vector<Event> events;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    EXPECT_TRUE(e.contains("pid") && e.at("pid").is_number_integer()) << e.dump();
    events.push_back(Event{e.at("name").get<std::string>(), e.at("ts").get<double>(), e.at("dur").get<double>(),
                           e.at("tid").get<int64_t>()});
  }
  return events;
}

bool inside(const Event& child, const Event& parent) {
  return child.tid == parent.tid && child.ts >= parent.ts && child.ts + child.dur <= parent.ts + parent.dur;
}

TEST(Nvtx, OffByDefaultWithoutTheEnvironment) {
  if (std::getenv("MT_NVTX") != nullptr || std::getenv("MT_TRACE") != nullptr) {
    GTEST_SKIP() << "MT_NVTX or MT_TRACE is set in this test's environment";
  }
  EXPECT_FALSE(nvtx::enabled());
  EXPECT_FALSE(nvtx::tracing());
}

TEST(Nvtx, SetEnabledTurnsRangesOnAndOff) {
  const bool before = nvtx::enabled();
  nvtx::set_enabled(true);
  EXPECT_TRUE(nvtx::enabled());
  { const nvtx::Range range("pushed while on"); }  // an NVTX push and pop, no trace
  nvtx::set_enabled(false);
  EXPECT_FALSE(nvtx::enabled());
  nvtx::set_enabled(before);
}

TEST(Nvtx, TraceIsValidJsonWithEachRangeInsideItsParent) {
  const std::string dir = scratch_dir("nested");
  const std::string path = dir + "/trace.json";
  const bool before = nvtx::enabled();
  nvtx::set_enabled(false);
  nvtx::start_trace(path);
  EXPECT_TRUE(nvtx::enabled()) << "a trace turns ranges on";
  EXPECT_TRUE(nvtx::tracing());
  const std::string inner_name = "inner \"quoted\" \\ name";  // escaped in the JSON
  {
    const nvtx::Range outer("outer");
    { const nvtx::Range inner(inner_name); }
    {
      const nvtx::Range second("second");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  std::thread([] { const nvtx::Range other("other thread"); }).join();
  nvtx::stop_trace();
  EXPECT_FALSE(nvtx::tracing());
  EXPECT_FALSE(nvtx::enabled()) << "stop_trace puts ranges back as they were";
  nvtx::set_enabled(before);

  const std::vector<Event> events = read_events(path);
  auto find = [&](const std::string& name) -> const Event* {
    for (const Event& e : events) {
      if (e.name == name) return &e;
    }
    return nullptr;
  };
  ASSERT_EQ(events.size(), 4u) << read_bytes(path);
  const Event *outer = find("outer"), *inner = find(inner_name), *second = find("second"),
              *other = find("other thread");
  ASSERT_TRUE(outer && inner && second && other) << read_bytes(path);
  EXPECT_TRUE(inside(*inner, *outer));
  EXPECT_TRUE(inside(*second, *outer));
  EXPECT_LE(inner->ts + inner->dur, second->ts) << "siblings in order, apart";
  EXPECT_GE(second->dur, 2000.0) << "dur is in microseconds";
  EXPECT_NE(other->tid, outer->tid);
  EXPECT_TRUE(dir_entries(dir) == std::vector<std::string>{"trace.json"}) << "no temporary file left";

  const std::string summary = nvtx::trace_summary();
  EXPECT_NE(summary.find(path), std::string::npos) << summary;
  EXPECT_LT(summary.find("outer"), summary.find("second")) << "sorted by total time:\n" << summary;
  EXPECT_NE(summary.find("host time"), std::string::npos) << summary;
}

TEST(Nvtx, NothingIsRecordedWhileOffOrFromBeforeTheTrace) {
  const std::string path = scratch_dir("off") + "/trace.json";
  const bool before = nvtx::enabled();
  nvtx::set_enabled(true);
  std::string summary;
  {
    const nvtx::Range opened_before("opened before the trace");
    nvtx::start_trace(path);
    nvtx::set_enabled(false);
    { const nvtx::Range off("while off"); }
    nvtx::set_enabled(true);
    { const nvtx::Range on("while on"); }
  }
  nvtx::stop_trace();
  nvtx::set_enabled(before);
  const std::vector<Event> events = read_events(path);
  ASSERT_EQ(events.size(), 1u) << read_bytes(path);
  EXPECT_EQ(events[0].name, "while on");
  EXPECT_EQ(nvtx::trace_summary().find("while off"), std::string::npos) << nvtx::trace_summary();
}

TEST(Nvtx, StartTraceRefusesAMissingDirectoryAndASecondTrace) {
  const std::string dir = scratch_dir("refused");
  const std::string missing = error_message_of([&] { nvtx::start_trace(dir + "/no/such/dir/t.json"); });
  EXPECT_NE(missing.find("start_trace: " + dir + "/no/such/dir/t.json: the directory"), std::string::npos) << missing;
  EXPECT_FALSE(nvtx::tracing());
  EXPECT_NE(error_message_of([] { nvtx::start_trace(""); }).find("empty"), std::string::npos);

  nvtx::start_trace(dir + "/first.json");
  const std::string twice = error_message_of([&] { nvtx::start_trace(dir + "/second.json"); });
  EXPECT_NE(twice.find("already records to " + dir + "/first.json"), std::string::npos) << twice;
  nvtx::stop_trace();
  nvtx::stop_trace();  // nothing records: nothing to do
  EXPECT_TRUE(dir_entries(dir) == std::vector<std::string>{"first.json"});
}

TEST(Nvtx, PercentPInThePathIsTheProcessId) {
  const std::string dir = scratch_dir("pid");
  nvtx::start_trace(dir + "/rank_%p.json");
  nvtx::stop_trace();
  EXPECT_TRUE(std::filesystem::exists(dir + "/rank_" + std::to_string(::getpid()) + ".json"))
      << ::testing::PrintToString(dir_entries(dir));
}

// Run only by the next test, in a child process with MT_NVTX=1 and MT_TRACE set.
TEST(NvtxEnvironment, DISABLED_ChildSeesRangesOnAndATraceRecording) {
  EXPECT_TRUE(nvtx::enabled());
  EXPECT_TRUE(nvtx::tracing());
  const nvtx::Range range("range of the child");  // written by the trace at exit
}

TEST(NvtxEnvironment, MtNvtxAndMtTraceAreReadAtStartAndTheTraceWrittenAtExit) {
  const std::string dir = scratch_dir("environment");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = "MT_NVTX=1 MT_TRACE='" + dir + "/child_%p.json' '" + self +
                              "' --gtest_also_run_disabled_tests "
                              "--gtest_filter=NvtxEnvironment.DISABLED_ChildSeesRangesOnAndATraceRecording > '" +
                              dir + "/log' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_bytes(dir + "/log");
  std::vector<std::string> traces;
  for (const std::string& name : dir_entries(dir)) {
    if (name.rfind("child_", 0) == 0) traces.push_back(name);
  }
  ASSERT_EQ(traces.size(), 1u) << ::testing::PrintToString(dir_entries(dir)) << "\n" << read_bytes(dir + "/log");
  const std::vector<Event> events = read_events(dir + "/" + traces[0]);
  ASSERT_EQ(events.size(), 1u) << read_bytes(dir + "/" + traces[0]);
  EXPECT_EQ(events[0].name, "range of the child");
}

TEST(NvtxEnvironment, AnUnwritableMtTraceIsReportedAndTheProgramRuns) {
  const std::string dir = scratch_dir("unwritable");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = "MT_TRACE='" + dir + "/missing/t.json' '" + self +
                              "' --gtest_filter=Nvtx.SetEnabledTurnsRangesOnAndOff > '" + dir + "/log' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_bytes(dir + "/log");
  const std::string log = read_bytes(dir + "/log");
  EXPECT_NE(log.find("mixtrain: MT_TRACE: start_trace: " + dir + "/missing/t.json: the directory"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace mt::testing
