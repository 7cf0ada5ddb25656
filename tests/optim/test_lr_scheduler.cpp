// Learning-rate schedules: values at chosen steps against the formulas written
// out here, every group scaled from its own base lr, argument errors, the
// optimizer really stepping with the scheduled lr, and state round trips.
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

namespace mt {
namespace {

constexpr double kPi = 3.14159265358979323846;

// An optimizer that only holds its groups: schedules touch nothing else.
class GroupsOnly : public Optimizer {
 public:
  explicit GroupsOnly(std::vector<ParamGroup> groups) : Optimizer(std::move(groups)) {}
  void step() override {}
  std::map<std::string, Tensor> state_dict() const override { return {}; }
  void load_state_dict(const std::map<std::string, Tensor>&) override {}
};

// Two groups with different base lrs.
struct TwoGroups {
  Tensor a = zeros({2}).requires_grad_();
  Tensor b = zeros({3}).requires_grad_();
  GroupsOnly opt{{ParamGroup{{a}, 0.1, 0.0}, ParamGroup{{b}, 0.02, 0.0}}};
};

void advance_to(LRScheduler& sched, int64_t step) {
  while (sched.last_step() < step) sched.step();
}

// Expects both groups at base * factor (to the last few bits).
void expect_lrs(TwoGroups& t, LRScheduler& sched, double factor) {
  EXPECT_DOUBLE_EQ(sched.last_lr(), 0.1 * factor) << "at step " << sched.last_step();
  EXPECT_DOUBLE_EQ(sched.last_lr(1), 0.02 * factor) << "at step " << sched.last_step();
  EXPECT_EQ(t.opt.param_groups()[0].lr, sched.last_lr(0));
  EXPECT_EQ(t.opt.param_groups()[1].lr, sched.last_lr(1));
}

TEST(WarmupCosineLR, ValuesAtWarmupCosineAndEnd) {
  TwoGroups t;
  const int64_t W = 10, N = 110;
  const double r = 0.1;
  WarmupCosineLR sched(t.opt, W, N, r);
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{0.1, 0.02}));

  // Step 0: lr 0, set by the constructor.
  EXPECT_EQ(sched.last_step(), 0);
  EXPECT_EQ(sched.last_lr(), 0.0);
  EXPECT_EQ(t.opt.param_groups()[1].lr, 0.0);

  advance_to(sched, 1);
  expect_lrs(t, sched, 1.0 / W);
  advance_to(sched, 5);  // the warmup midpoint
  expect_lrs(t, sched, 0.5);
  advance_to(sched, 9);
  expect_lrs(t, sched, 9.0 / W);
  advance_to(sched, W);  // warmup done: the base lr
  expect_lrs(t, sched, 1.0);
  advance_to(sched, 35);  // a quarter of the cosine
  expect_lrs(t, sched, r + (1 - r) * 0.5 * (1 + std::cos(kPi * 25.0 / 100.0)));
  advance_to(sched, 60);  // the cosine midpoint: halfway between base and floor
  expect_lrs(t, sched, r + (1 - r) * 0.5);
  advance_to(sched, N - 1);
  expect_lrs(t, sched, r + (1 - r) * 0.5 * (1 + std::cos(kPi * 99.0 / 100.0)));
  advance_to(sched, N);  // the end: the floor
  expect_lrs(t, sched, r);
  advance_to(sched, 500);  // constant after
  expect_lrs(t, sched, r);
}

TEST(WarmupCosineLR, RisesThenFallsMonotonicallyToZero) {
  TwoGroups t;
  WarmupCosineLR sched(t.opt, /*warmup_steps=*/4, /*total_steps=*/20);
  double previous = sched.last_lr();
  for (int s = 1; s <= 4; ++s) {
    sched.step();
    EXPECT_GT(sched.last_lr(), previous) << s;
    previous = sched.last_lr();
  }
  for (int s = 5; s <= 20; ++s) {
    sched.step();
    EXPECT_LT(sched.last_lr(), previous) << s;
    previous = sched.last_lr();
  }
  EXPECT_EQ(sched.last_lr(), 0.0);  // min_lr_ratio 0
}

TEST(WarmupCosineLR, NoWarmupStartsAtTheBaseAndWarmupEqualToTotalEndsOnTheFloor) {
  TwoGroups t;
  WarmupCosineLR cold(t.opt, /*warmup_steps=*/0, /*total_steps=*/8, /*min_lr_ratio=*/0.25);
  expect_lrs(t, cold, 1.0);
  advance_to(cold, 4);
  expect_lrs(t, cold, 0.25 + 0.75 * 0.5);

  TwoGroups u;
  WarmupCosineLR flat(u.opt, /*warmup_steps=*/4, /*total_steps=*/4, /*min_lr_ratio=*/0.25);
  advance_to(flat, 3);
  expect_lrs(u, flat, 0.75);
  advance_to(flat, 4);
  expect_lrs(u, flat, 0.25);
}

TEST(WarmupCosineLR, AWarmupAboveZeroStartsAtOneOverWPlusOneAndRisesIntoTheCosine) {
  TwoGroups t;
  const int64_t W = 4;
  WarmupCosineLR sched(t.opt, W, /*total_steps=*/20, /*min_lr_ratio=*/0.1, WarmupStart::above_zero);
  expect_lrs(t, sched, 1.0 / (W + 1));  // step 0 already moves the weights
  double previous = sched.last_lr();
  for (int64_t s = 1; s <= W; ++s) {
    sched.step();
    EXPECT_GT(sched.last_lr(), previous) << s;
    previous = sched.last_lr();
  }
  expect_lrs(t, sched, 1.0);  // step W: the peak, where the cosine begins as in the default mode
  advance_to(sched, 12);
  expect_lrs(t, sched, 0.1 + 0.9 * 0.5);
}

TEST(WarmupCosineLR, BadArgumentsGiveClearErrors) {
  TwoGroups t;
  EXPECT_NE(error_message_of([&] { WarmupCosineLR(t.opt, -1, 10); }).find("warmup_steps must be >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] { WarmupCosineLR(t.opt, 0, 0); }).find("total_steps must be > 0, got 0"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] { WarmupCosineLR(t.opt, 0, -5); }).find("total_steps must be > 0, got -5"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] {
              WarmupCosineLR(t.opt, 11, 10);
            }).find("warmup_steps (11) must not exceed total_steps (10)"),
            std::string::npos);
  EXPECT_NE(
      error_message_of([&] { WarmupCosineLR(t.opt, 1, 10, 1.5); }).find("min_lr_ratio must be in [0, 1], got 1.5"),
      std::string::npos);
  EXPECT_NE(error_message_of([&] { WarmupCosineLR(t.opt, 1, 10, std::nan("")); }).find("min_lr_ratio"),
            std::string::npos);
}

TEST(StepLR, DecaysByGammaEveryStepSize) {
  TwoGroups t;
  StepLR sched(t.opt, /*step_size=*/3, /*gamma=*/0.5);
  expect_lrs(t, sched, 1.0);
  advance_to(sched, 2);
  expect_lrs(t, sched, 1.0);
  advance_to(sched, 3);
  expect_lrs(t, sched, 0.5);
  advance_to(sched, 5);
  expect_lrs(t, sched, 0.5);
  advance_to(sched, 9);
  expect_lrs(t, sched, 0.125);
  advance_to(sched, 31);  // 31 / 3 = 10 decays
  expect_lrs(t, sched, std::pow(0.5, 10));

  EXPECT_NE(error_message_of([&] { StepLR(t.opt, 0, 0.5); }).find("step_size must be > 0, got 0"), std::string::npos);
  EXPECT_NE(error_message_of([&] { StepLR(t.opt, -2, 0.5); }).find("step_size must be > 0, got -2"), std::string::npos);
  EXPECT_NE(error_message_of([&] { StepLR(t.opt, 2, 0.0); }).find("gamma must be positive and finite, got 0"),
            std::string::npos);
}

TEST(ConstantLR, KeepsTheBaseOrAFactorForTotalIters) {
  TwoGroups t;
  ConstantLR plain(t.opt);
  for (int s = 0; s < 5; ++s) {
    expect_lrs(t, plain, 1.0);
    plain.step();
  }

  TwoGroups u;
  ConstantLR reduced(u.opt, /*factor=*/0.5, /*total_iters=*/4);
  expect_lrs(u, reduced, 0.5);
  advance_to(reduced, 3);
  expect_lrs(u, reduced, 0.5);
  advance_to(reduced, 4);
  expect_lrs(u, reduced, 1.0);

  EXPECT_NE(error_message_of([&] { ConstantLR(u.opt, 2.0, 3); }).find("factor must be in [0, 1], got 2"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] { ConstantLR(u.opt, 0.5, -1); }).find("total_iters must be >= 0, got -1"),
            std::string::npos);
}

TEST(LRScheduler, TheOptimizerStepsWithTheScheduledLr) {
  Tensor w = full({1}, 1.0, DType::f64).requires_grad_();
  SGD opt({w}, SGDOptions(0.1));
  WarmupCosineLR sched(opt, /*warmup_steps=*/2, /*total_steps=*/4);
  sum(w * w).backward();  // g = 2
  opt.step();             // lr 0 at step 0: w stays
  EXPECT_EQ(w.item(), 1.0);
  sched.step();  // lr 0.05
  opt.zero_grad();
  sum(w * w).backward();
  opt.step();
  EXPECT_DOUBLE_EQ(w.item(), 1.0 - 0.05 * 2.0);
}

TEST(LRScheduler, StateRoundTripsAndResumesTheSameSchedule) {
  TwoGroups t;
  WarmupCosineLR sched(t.opt, 10, 100, 0.1);
  advance_to(sched, 37);
  const std::map<std::string, double> state = sched.state_dict();
  EXPECT_EQ(state, (std::map<std::string, double>{{"last_step", 37.0}}));

  TwoGroups u;
  WarmupCosineLR resumed(u.opt, 10, 100, 0.1);
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.last_step(), 37);
  EXPECT_EQ(resumed.last_lrs(), sched.last_lrs());
  EXPECT_EQ(u.opt.param_groups()[1].lr, t.opt.param_groups()[1].lr);
  for (int i = 0; i < 5; ++i) {
    sched.step();
    resumed.step();
    EXPECT_EQ(resumed.last_lrs(), sched.last_lrs());
  }

  EXPECT_NE(error_message_of([&] { resumed.load_state_dict({}); }).find("missing 'last_step'"), std::string::npos);
  EXPECT_NE(error_message_of([&] {
              resumed.load_state_dict({{"last_step", -1.0}});
            }).find("non-negative integer, got -1"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] {
              resumed.load_state_dict({{"last_step", 2.5}});
            }).find("non-negative integer, got 2.5"),
            std::string::npos);
}

TEST(LRScheduler, GroupsAddedUnderTheSchedulerAreAnError) {
  TwoGroups t;
  StepLR sched(t.opt, 2, 0.5);
  t.opt.param_groups().push_back(ParamGroup{{zeros({1}).requires_grad_()}, 0.3, 0.0});
  EXPECT_NE(error_message_of([&] { sched.step(); }).find("the optimizer has 3 parameter groups but had 2"),
            std::string::npos);
  EXPECT_THROW(sched.last_lr(5), Error);
}

}  // namespace
}  // namespace mt
