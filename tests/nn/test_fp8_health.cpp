// The health of FP8 scaling states: Fp8TensorState counts the updates whose cast saturated
// (amax * scale beyond fp8_max plus half its ulp), the same on both devices; nn::fp8_health sums a model's states up;
// and Fp8StateRestoreGuard lets forwards run on copies of the states, leaving the originals untouched.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "autograd/autocast.h"
#include "ops/fp8/fp8_autocast.h"
#include "ops/nn/fp8_state_dict.h"
#include "ops/nn/gpt.h"
#include "ops/ops.h"
#include "tests/nn/fp8_test_models.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int64_t overflows_of(const Fp8TensorState& s) { return s.overflows.to(kCPU).to_vector<int64_t>()[0]; }

// A state's scale set by hand (and its inverse with it, as the casts read both).
void set_scale(Fp8TensorState& s, double scale) {
  s.scale.fill_(scale);
  s.scale_inv.fill_(1.0 / scale);
}

// One update with the scale set to `scale` first: the scale the cast that measured `amax` used.
int64_t overflows_after(Fp8TensorState& s, double scale, double amax) {
  set_scale(s, scale);
  s.update(full({1}, amax, TensorOptions().device(s.scale.device())));
  return overflows_of(s);
}

void expect_counts_saturated_casts(Device device) {
  Fp8TensorState e4m3(DelayedScaling{/*history_len=*/4, DelayedScaling::Amax::max, /*margin=*/0, DType::f8e4m3},
                      device);
  EXPECT_EQ(overflows_of(e4m3), 0);
  EXPECT_EQ(overflows_after(e4m3, 1.0, 448.0), 0) << "fp8_max itself";
  EXPECT_EQ(overflows_after(e4m3, 2.0, 232.0), 0) << "464 rounds to 448 (the tie goes to even)";
  EXPECT_EQ(overflows_after(e4m3, 2.0, 232.5), 1) << "465 would round to 480: saturated";
  EXPECT_EQ(overflows_after(e4m3, 0.5, 930.0), 2) << "a count of every update since the state was made";
  EXPECT_EQ(overflows_after(e4m3, 1.0, kInf), 3) << "an infinite amax saturates";
  EXPECT_EQ(overflows_after(e4m3, 1.0, kNaN), 3) << "a NaN is cast to NaN, not saturated";
  EXPECT_EQ(overflows_after(e4m3, 1.0, 0.0), 3);

  // E5M2's range is its own, and the margin lowers the next scale, not the limit of this cast.
  Fp8TensorState e5m2(DelayedScaling{/*history_len=*/2, DelayedScaling::Amax::most_recent, /*margin=*/3, DType::f8e5m2},
                      device);
  EXPECT_EQ(overflows_after(e5m2, 1.0, 61440.0), 0) << "fp8_max plus half an ulp counts as rounded";
  EXPECT_EQ(overflows_after(e5m2, 1.0, 61441.0), 1);
  EXPECT_EQ(e5m2.scale.to(kCPU).to_vector<float>()[0], 57344.0f / 8.0f / 61441.0f);

  EXPECT_EQ(e4m3.state_dict().count("overflows"), 0u) << "a health figure, not saved state";
}

TEST(Fp8Health, TensorStateCountsSaturatedCasts) { expect_counts_saturated_casts(kCPU); }

TEST(Fp8HealthCuda, TensorStateCountsSaturatedCasts) {
  MT_SKIP_WITHOUT_CUDA();
  expect_counts_saturated_casts(Device(DeviceType::cuda, 0));
}

struct Batch {
  Tensor x, y;
};
Batch make_batch() {
  std::vector<double> ids;
  for (int i = 0; i < 4 * 17; ++i) ids.push_back((7 * i + 3) % 37);
  const Tensor seq = from_vector(ids, {4, 17}, DType::i64);
  return {seq.slice(1, 0, 16), seq.slice(1, 1, 17)};
}

// One forward and backward under bf16 autocast and FP8.
void step(const GPT& model, const Fp8Recipe& recipe) {
  AutocastGuard amp(DeviceType::cpu, DType::bf16);
  Fp8AutocastGuard fp8(DeviceType::cpu, recipe);
  const Batch b = make_batch();
  model.loss(b.x, b.y).backward();
}

TEST(Fp8Health, SumsUpTheDelayedScalingStatesOfAModel) {
  Generator gen(1);
  GPT model(fp8_gpt_config(), &gen);
  const Fp8Health none = fp8_health(model);
  EXPECT_EQ(none.layers, 0);
  EXPECT_EQ(none.states, 0);
  EXPECT_TRUE(std::isnan(none.min_scale) && std::isnan(none.max_scale));

  step(model, Fp8Recipe::delayed());
  step(model, Fp8Recipe::delayed());
  const Fp8Health health = fp8_health(model);
  EXPECT_EQ(health.layers, 8);
  EXPECT_EQ(health.states, 24);
  EXPECT_EQ(health.overflows, 0);
  double lo = kInf, hi = 0;
  for (const auto& [key, t] : fp8_state_dict(model)) {
    if (key.size() < 6 || key.compare(key.size() - 6, 6, ".scale") != 0) continue;
    lo = std::min(lo, t.item());
    hi = std::max(hi, t.item());
  }
  EXPECT_EQ(health.min_scale, lo);
  EXPECT_EQ(health.max_scale, hi);
  EXPECT_LT(health.min_scale, health.max_scale) << "x, W and dy have scales of their own";

  // A scale far too large for the next input: that cast saturates, and only that one.
  Linear* first = linears_of(model)[0];
  set_scale(first->fp8_state->input, 1e6);
  step(model, Fp8Recipe::delayed());
  EXPECT_EQ(overflows_of(first->fp8_state->input), 1);
  int64_t sum = 0;
  for (Linear* l : linears_of(model)) {
    for (const Fp8TensorState* t : {&l->fp8_state->input, &l->fp8_state->weight, &l->fp8_state->grad_output}) {
      sum += overflows_of(*t);
    }
  }
  EXPECT_EQ(fp8_health(model).overflows, sum);
  EXPECT_EQ(sum, 1);
}

// Current scaling keeps no history, but each cast leaves its scale: the report is the scales of the
// latest x, W and dy casts (fp8_max over each tensor's own amax) and no saturation.
TEST(Fp8Health, CurrentScalingReportsTheLatestCastsScales) {
  Generator gen(2);
  GPT model(fp8_gpt_config(), &gen);
  EXPECT_TRUE(std::isnan(fp8_health(model).min_scale)) << "nothing cast yet";
  step(model, Fp8Recipe::current());
  const Fp8Health health = fp8_health(model);
  EXPECT_EQ(health.layers, 8);
  EXPECT_EQ(health.states, 3 * 8);
  EXPECT_EQ(health.overflows, 0);
  const Linear* first = linears_of(model)[0];
  const double weight_scale = first->fp8_state->weight.last_scale.to(kCPU).to_vector<double>()[0];
  const double weight_amax = max(abs(first->weight.detach())).to(kCPU).item();
  EXPECT_NEAR(weight_scale, 448.0 / weight_amax, 1e-5 * weight_scale) << "E4M3's max over the weight's amax";
  EXPECT_LE(health.min_scale, weight_scale);
  EXPECT_GE(health.max_scale, weight_scale);
  EXPECT_LT(health.min_scale, health.max_scale) << "x, W and dy have scales of their own";
}

// Everything of a layer's state the guard must leave alone, as values.
struct Snapshot {
  std::vector<std::vector<double>> tensors;
  std::vector<int64_t> casts;
  std::vector<const Fp8LinearState*> objects;
  bool operator==(const Snapshot& o) const { return tensors == o.tensors && casts == o.casts && objects == o.objects; }
};
Snapshot snapshot(const Module& model) {
  Snapshot s;
  for (Linear* l : linears_of(model)) {
    s.objects.push_back(l->fp8_state.get());
    if (!l->fp8_state) continue;
    s.casts.push_back(l->fp8_state->weight_cache.casts);
    for (const Fp8TensorState* t : {&l->fp8_state->input, &l->fp8_state->weight, &l->fp8_state->grad_output}) {
      for (const Tensor& v : {t->amax_history, t->scale, t->scale_inv, t->overflows}) {
        s.tensors.push_back(v.to_vector<double>());
      }
    }
  }
  return s;
}

TEST(Fp8Health, UnderTheRestoreGuardForwardsMoveCopiesOfTheStates) {
  Generator gen(3);
  GPT model(fp8_gpt_config(), &gen);
  step(model, Fp8Recipe::delayed());
  const Snapshot before = snapshot(model);
  {
    Fp8StateRestoreGuard guard(model);
    Linear* first = linears_of(model)[0];
    EXPECT_NE(first->fp8_state.get(), before.objects[0]) << "a copy";
    EXPECT_EQ(first->fp8_state->weight_cache.casts, 0) << "the copy casts its weight again";
    set_scale(first->fp8_state->input, 1e6);  // an overflow, counted by the copy alone
    step(model, Fp8Recipe::delayed());
    step(model, Fp8Recipe::delayed());
    EXPECT_EQ(overflows_of(first->fp8_state->input), 1);
    EXPECT_FALSE(snapshot(model) == before);
  }
  EXPECT_TRUE(snapshot(model) == before) << "the states, their counters and weight caches as they were";

  // Layers without a state before the guard have none after it.
  GPT fresh(fp8_gpt_config(), &gen);
  {
    Fp8StateRestoreGuard guard(fresh);
    step(fresh, Fp8Recipe::delayed());
    EXPECT_EQ(fp8_health(fresh).layers, 8);
  }
  EXPECT_EQ(fp8_health(fresh).layers, 0);
  EXPECT_TRUE(fp8_state_dict(fresh).empty());
}

}  // namespace
}  // namespace mt::nn
