// OpProfiler: every forward op and backward node of a step is charged to its own
// interval, once per step, and the intervals add up to the step.
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "autograd/node.h"
#include "autograd/profiler.h"
#include "ops/nn/gpt.h"
#include "ops/ops.h"
#include "tests/nn/tiny_gpt.h"
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

// The intervals by module: the same total as by op, the blocks' paths named, a backward node
// charged to the module whose forward recorded it, and the engine's own work outside modules.
void expect_module_rows_name_the_blocks(const std::string& checkpointing) {
  Generator init(5);
  nn::GPT model(nn::tiny_config(), &init);
  model.set_checkpointing(nn::GPTCheckpointing::parse(checkpointing));
  nn::name_modules_for_tracing(model, "gpt");
  Generator data(6);
  const Tensor ids = uniform({2, 8}, 0, 37, {}, &data).to(DType::i64);
  const Tensor targets = uniform({2, 8}, 0, 37, {}, &data).to(DType::i64);
  OpProfiler profiler(Device("cpu"));
  for (int step = 0; step < 2; ++step) {
    const Tensor loss = model.loss(ids, targets);
    // The loss op is recorded by GPT::loss itself, inside the model's scope.
    const autograd::Node& node = *autograd::meta(loss).grad_fn;
    ASSERT_NE(node.profiler_module, nullptr);
    EXPECT_EQ(*node.profiler_module, "gpt");
    loss.backward();
    profiler.step();
  }
  const std::vector<OpProfiler::Row> by_op = profiler.rows(), by_module = profiler.module_rows();
  double op_total = 0, module_total = 0;
  int64_t op_calls = 0, module_calls = 0;
  for (const OpProfiler::Row& r : by_op) op_total += r.total_ms, op_calls += r.calls;
  for (const OpProfiler::Row& r : by_module) module_total += r.total_ms, module_calls += r.calls;
  EXPECT_NEAR(module_total, op_total, 1e-9 * op_total) << profiler.module_report();
  EXPECT_EQ(module_calls, op_calls) << "each interval charged once either way";
  for (const std::string label :
       {"gpt", "gpt.transformer", "gpt.transformer.wte", "gpt.transformer.h.0.ln_1", "gpt.transformer.h.0.attn",
        "gpt.transformer.h.0.attn.c_attn", "gpt.transformer.h.1.attn.c_proj", "gpt.transformer.h.1.mlp",
        "gpt.transformer.ln_f", "(outside modules)"}) {
    const OpProfiler::Row* r = find_row(by_module, label);
    ASSERT_NE(r, nullptr) << "no row " << label << " in\n" << profiler.module_report(100);
    EXPECT_GT(r->calls, 0) << label;
  }
  // Each c_attn records one Linear node a step and runs its backward once: two intervals a step.
  EXPECT_EQ(find_row(by_module, "gpt.transformer.h.1.attn.c_attn")->calls, 2 * 2) << profiler.module_report(100);
  const std::string report = profiler.module_report();
  EXPECT_NE(report.find("module profile on cpu over 2 steps"), std::string::npos) << report;
  EXPECT_NE(report.find("gpt.transformer.h.0.attn"), std::string::npos) << report;
}

TEST(OpProfiler, ModuleRowsAddUpToTheOpRowsAndNameTheBlocks) { expect_module_rows_name_the_blocks("off"); }

TEST(OpProfiler, ModuleRowsChargeTheRecomputationToTheBlocks) { expect_module_rows_name_the_blocks("blocks"); }

TEST(OpProfiler, NodesKeepNoModuleWithoutAProfiler) {
  nn::GPT model(nn::tiny_config());
  nn::name_modules_for_tracing(model, "gpt");
  const Tensor ids = zeros({1, 4}, DType::i64);
  const Tensor loss = model.loss(ids, ids);
  EXPECT_EQ(autograd::meta(loss).grad_fn->profiler_module, nullptr);
  EXPECT_EQ(OpProfiler::current_module(), nullptr);
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
