// OpProfiler: every forward op and backward node of a step is charged to its own
// interval, once per step, and the intervals add up to the step.
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "autograd/profiler.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

const OpProfiler::Row* find_row(const std::vector<OpProfiler::Row>& rows, const std::string& label) {
  for (const OpProfiler::Row& r : rows) {
    if (r.label == label) return &r;
  }
  return nullptr;
}

TEST(OpProfiler, ChargesEachOpOnceAStepAndTheRestToAfterBackward) {
  Generator gen(3);
  Tensor w = randn({64, 64}, DType::f64, &gen).requires_grad_();
  const Tensor x = randn({32, 64}, DType::f64, &gen);
  const auto wall_start = std::chrono::steady_clock::now();
  OpProfiler profiler(Device("cpu"));
  for (int step = 0; step < 3; ++step) {
    sum(tanh(linear(x, w))).backward();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // "the optimizer"
    profiler.step();
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall_start).count();
  EXPECT_EQ(profiler.steps(), 3);
  const std::vector<OpProfiler::Row> rows = profiler.rows();
  for (const std::string label : {"forward Linear", "forward tanh", "forward Sum", "backward LinearBackward",
                                  "backward tanhBackward", "after backward"}) {
    const OpProfiler::Row* r = find_row(rows, label);
    ASSERT_NE(r, nullptr) << "no interval " << label << " in\n" << profiler.report();
    EXPECT_EQ(r->calls, 3) << label;
  }
  // The sleeps land in "after backward"; the intervals tile the steps, so they
  // add up to no more than the wall time around them. (Which interval is the
  // largest is not checked: on a loaded machine any op can be preempted.)
  EXPECT_GE(find_row(rows, "after backward")->total_ms, 15.0) << profiler.report();
  EXPECT_LE(profiler.total_ms(), wall_ms) << profiler.report();
  const std::string report = profiler.report();
  EXPECT_NE(report.find("over 3 steps"), std::string::npos) << report;
  EXPECT_NE(report.find("forward Linear"), std::string::npos) << report;
}

TEST(OpProfiler, ProfileStepsRunsTheStepThatManyTimesAndReportsThem) {
  Generator gen(4);
  Tensor w = randn({8, 8}, DType::f64, &gen).requires_grad_();
  const Tensor x = randn({4, 8}, DType::f64, &gen);
  int runs = 0;
  const std::string report = profile_steps(Device("cpu"), 4, [&] {
    sum(linear(x, w)).backward();
    ++runs;
  });
  EXPECT_EQ(runs, 4);
  EXPECT_NE(report.find("over 4 steps"), std::string::npos) << report;
  EXPECT_NE(report.find("backward LinearBackward"), std::string::npos) << report;
  EXPECT_FALSE(OpProfiler::active()) << "the profiler outlived profile_steps";
}

TEST(OpProfiler, OnlyOneAtATimeAndNothingIsMarkedWithoutOne) {
  EXPECT_FALSE(OpProfiler::active());
  {
    OpProfiler first(Device("cpu"));
    EXPECT_TRUE(OpProfiler::active());
    EXPECT_NE(error_message_of([] { OpProfiler second(Device("cpu")); }).find("another profiler"), std::string::npos);
  }
  EXPECT_FALSE(OpProfiler::active());
}

}  // namespace
}  // namespace mt::testing
