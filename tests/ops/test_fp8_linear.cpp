// fp8_linear and FP8 autocast (ops/fp8/fp8_linear.h, fp8_autocast.h): the forward and both
// gradients against f64 within the bound FP8 rounding allows (fp8_test_util.h), the op as its
// primitives composed bit for bit, the delayed-scaling update points, the weight cache, M padding
// and the N/K fallback, the state's save and restore, the guard, and nn::Linear under it (off:
// today's linear bit for bit). CUDA: the same contracts on the GPU (native FP8 GEMMs where the
// GPU has them), skipped without one.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "ops/fp8/fp8_autocast.h"
#include "ops/fp8/fp8_linear.h"
#include "ops/nn/fp8_state_dict.h"
#include "ops/nn/layers.h"
#include "tests/ops/fp8_test_util.h"
#include "tests/ops/ops_test_util.h"

namespace mt::testing {
namespace {

using Scaling = Fp8Recipe::Scaling;

Tensor leaf(const Shape& shape, double scale, uint64_t seed, Device device) {
  Generator gen(seed);
  return (randn(shape, DType::f32, &gen) * scale).to(device).requires_grad_(true);
}

std::vector<float> floats(const Tensor& t) { return raw::to(t, DType::f32).to(kCPU).to_vector<float>(); }

Tensor rows(const Tensor& t, int64_t cols) { return raw::reshape(t.detach(), {-1, cols}).to(kCPU); }
Tensor transposed(const Tensor& t) { return raw::contiguous(raw::transpose(t, 0, 1)); }

// Current scaling: each cast's scale is the one fp8_test_util's cast() computes from the tensor's amax,
// so the bound derived for fp8_gemm's operands applies to the op's three GEMMs as they are.
void expect_within_bound(Device device, const Shape& x_shape, int64_t n) {
  const int64_t k = x_shape.back();
  const Tensor x = leaf(x_shape, 1.0, 1, device), w = leaf({n, k}, 0.05, 2, device);
  const Tensor b = leaf({n}, 0.1, 3, device);
  Shape y_shape = x_shape;
  y_shape.back() = n;
  Generator gen(4);
  const Tensor g = (randn(y_shape, DType::f32, &gen) * 1e-4).to(device);
  const auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::current(), device);
  const Tensor y = fp8_linear(x, w, Tensor(), state);
  const Tensor yb = fp8_linear(x, w, b, state);
  ASSERT_EQ(y.shape(), y_shape);
  ASSERT_EQ(y.dtype(), DType::f32);
  yb.backward(g);
  const bool native = fp8_native_available(device);
  const std::string on = " " + shape_str(x_shape) + " on " + device.str();
  const Tensor x2 = rows(x, k), w2 = w.detach().to(kCPU), g2 = rows(g, n);
  const Cast cx = cast(x2, DType::f8e4m3, kCPU), cw = cast(w2, DType::f8e4m3, kCPU);
  const Cast cg = cast(g2, DType::f8e5m2, kCPU);
  expect_within_rounding_bound(x2, w2, cx, cw, rows(y, n), native, "forward" + on);
  expect_within_rounding_bound(g2, transposed(w2), cg, cw, rows(x.grad(), k), native, "dgrad" + on);
  expect_within_rounding_bound(transposed(g2), transposed(x2), cg, cx, w.grad().to(kCPU), native, "wgrad" + on);
  // The bias, rounded to bf16 (what the FP8 GEMM reads), added in f32 to the same product.
  const std::vector<double> plain = values_of(y), biased = values_of(yb);
  const std::vector<double> bias = values_of(b.detach().to(DType::bf16));
  for (size_t i = 0; i < plain.size(); ++i) {
    const double want = plain[i] + bias[i % static_cast<size_t>(n)];
    ASSERT_LE(std::abs(biased[i] - want), 2 * kU32 * (std::abs(plain[i]) + std::abs(want))) << i << on;
  }
  // db: dy's row sums in f32, from dy itself.
  const std::vector<double> gv = values_of(g2), db = values_of(b.grad());
  ASSERT_EQ(b.grad().dtype(), DType::f32);
  const int64_t m = g2.size(0);
  for (int64_t j = 0; j < n; ++j) {
    double want = 0, mag = 0;
    for (int64_t i = 0; i < m; ++i) {
      want += gv[i * n + j];
      mag += std::abs(gv[i * n + j]);
    }
    ASSERT_LE(std::abs(db[j] - want), gamma(m) * mag) << "db " << j << on;
  }
}

TEST(Fp8Linear, ForwardAndGradientsStayWithinTheRoundingBound) {
  expect_within_bound(kCPU, {64, 96}, 48);
  expect_within_bound(kCPU, {3, 13, 64}, 32);  // M = 39: padded to 48 inside the op
}

// The op is its primitives composed: the casts with the state's scales as they stood before the
// call (delayed scaling), the three GEMMs in the layouts of the header. Two steps, so the second
// forward shows the scales the first one's amaxes set, and reuses the weight cast at scale 1.
void expect_primitives_bit_for_bit(Device device) {
  const int64_t m = 32, k = 64, n = 48;
  const auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(4), device);
  const Tensor w = leaf({n, k}, 0.05, 7, device), b = leaf({n}, 0.1, 8, device);
  for (uint64_t step = 0; step < 2; ++step) {
    const Tensor x = leaf({m, k}, 1.0, 10 + step, device);
    Generator gen(20 + step);
    const Tensor g = (randn({m, n}, DType::f32, &gen) * 1e-3).to(device);
    const Tensor sx = state->input.scale.clone(), sxi = state->input.scale_inv.clone();
    const Tensor sg = state->grad_output.scale.clone(), sgi = state->grad_output.scale_inv.clone();
    const Tensor sw = f32_scalar(1.0f, device);  // the weight's one cast, at its fresh scale
    if (step == 1) EXPECT_NE(scalar_of(sx), 1.0) << "the first forward's amax sets the second one's scale";
    if (w.grad().defined()) w.grad().zero_();
    const Tensor y = fp8_linear(x, w, b, state);
    y.backward(g);
    const auto q = [](const Tensor& t, const Tensor& s, DType f, Fp8Layout l = Fp8Layout::as_is) {
      return quantize_fp8(t.detach(), s, f, l).data;
    };
    const Tensor want_y =
        fp8_gemm(q(x, sx, DType::f8e4m3), q(w, sw, DType::f8e4m3), sxi, sw, DType::f32, b.detach().to(DType::bf16));
    const Tensor want_dx =
        fp8_gemm(q(g, sg, DType::f8e5m2), q(w, sw, DType::f8e4m3, Fp8Layout::transposed), sgi, sw, DType::f32);
    const Tensor want_dw = fp8_gemm(q(g, sg, DType::f8e5m2, Fp8Layout::transposed),
                                    q(x, sx, DType::f8e4m3, Fp8Layout::transposed), sgi, sxi, DType::f32);
    const std::string what = "step " + std::to_string(step) + " on " + device.str();
    EXPECT_EQ(floats(y), floats(want_y)) << what;
    EXPECT_EQ(floats(x.grad()), floats(want_dx)) << what;
    EXPECT_EQ(floats(w.grad()), floats(want_dw)) << what;
  }
}

TEST(Fp8Linear, IsItsPrimitivesComposedBitForBit) { expect_primitives_bit_for_bit(kCPU); }

float head(const Fp8TensorState& s) { return s.amax_history.to(kCPU).to_vector<float>()[0]; }
std::vector<float> history(const Fp8TensorState& s) { return s.amax_history.to(kCPU).to_vector<float>(); }
float amax(const Tensor& t) { return fp8_amax(t.detach()).to(kCPU).to_vector<float>()[0]; }
float scale(const Fp8TensorState& s) { return s.scale.to(kCPU).to_vector<float>()[0]; }

// Note [FP8 scaling update points]: x's state moves at each forward, dy's at each backward, W's at
// each cast of the weight (one per optimizer step); each scale is fp8_max / max(history).
void expect_delayed_update_points(Device device) {
  const auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(3), device);
  const Tensor w = leaf({16, 32}, 0.05, 1, device);
  EXPECT_EQ(history(state->input), std::vector<float>(3, 0.0f));
  EXPECT_EQ(scale(state->input), 1.0f);
  std::vector<float> ax, ag;
  for (uint64_t step = 0; step < 3; ++step) {
    const Tensor x = leaf({16, 32}, 1.0 + static_cast<double>(step), 10 + step, device);
    Generator gen(30 + step);
    const Tensor g = (randn({16, 16}, DType::f32, &gen) * (step == 1 ? 1e-2 : 1e-3)).to(device);
    const Tensor y = fp8_linear(x, w, Tensor(), state);
    ax.insert(ax.begin(), amax(x));
    EXPECT_EQ(head(state->input), ax[0]) << "forward " << step;
    EXPECT_EQ(scale(state->input), 448.0f / *std::max_element(ax.begin(), ax.end())) << "forward " << step;
    EXPECT_EQ(history(state->weight), (std::vector<float>{amax(w), 0.0f, 0.0f})) << "one cast of the weight";
    EXPECT_EQ(scale(state->weight), 448.0f / amax(w));
    EXPECT_EQ(history(state->grad_output)[0], step == 0 ? 0.0f : ag[0]) << "backward has not run yet";
    y.backward(g);
    ag.insert(ag.begin(), amax(g));
    EXPECT_EQ(head(state->grad_output), ag[0]) << "backward " << step;
    EXPECT_EQ(scale(state->grad_output), 57344.0f / *std::max_element(ag.begin(), ag.end())) << "backward " << step;
    EXPECT_EQ(head(state->input), ax[0]) << "backward leaves x's state";
  }
  // An evaluation forward casts x (its state moves) and nothing of the backward.
  NoGradGuard no_grad;
  const Tensor x = leaf({16, 32}, 0.5, 99, device);
  fp8_linear(x, w, Tensor(), state);
  EXPECT_EQ(head(state->input), amax(x));
  EXPECT_EQ(head(state->grad_output), ag[0]);
  EXPECT_EQ(state->weight_cache.casts, 1);
}

TEST(Fp8Linear, DelayedScalingMovesAtEachCast) { expect_delayed_update_points(kCPU); }

// Note [FP8 weight cache]: two micro-batches read one cast of the weight; an in-place update (what
// an optimizer step does) makes the next forward cast again.
TEST(Fp8Linear, WeightCastOncePerUpdate) {
  const auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(4), kCPU);
  const Tensor w = leaf({32, 16}, 0.05, 1, kCPU);
  const auto micro_batch = [&](uint64_t seed) {
    fp8_linear(leaf({16, 16}, 1.0, seed, kCPU), w, Tensor(), state).backward(ones({16, 32}) * 1e-3);
  };
  micro_batch(1);
  const Tensor q = state->weight_cache.q, q_t = state->weight_cache.q_t;
  ASSERT_TRUE(q.defined() && q_t.defined());
  micro_batch(2);
  EXPECT_EQ(state->weight_cache.casts, 1);
  EXPECT_EQ(state->weight_cache.q.impl(), q.impl());
  EXPECT_EQ(state->weight_cache.q_t.impl(), q_t.impl());
  EXPECT_EQ(history(state->weight)[1], 0.0f);
  {
    NoGradGuard no_grad;
    w.copy_(w.detach() * 2.0);  // the step
  }
  micro_batch(3);
  EXPECT_EQ(state->weight_cache.casts, 2);
  EXPECT_NE(state->weight_cache.q.impl(), q.impl());
  EXPECT_EQ(history(state->weight), (std::vector<float>{amax(w), amax(w) / 2, 0.0f, 0.0f}));
  // Cast again from the new values: q(2 W) at the scale 448 / amax(W) is q(W) at scale 224 / amax(W).
  EXPECT_EQ(floats(state->weight_cache.q),
            floats(quantize_fp8(w.detach(), state->weight_cache.scale, DType::f8e4m3).data));
}

// M = 39 padded inside the op equals the caller padding x and dy with zero rows, bit for bit.
TEST(Fp8Linear, RowsThatAreNotAMultipleOf16AreZeroPadded) {
  const int64_t k = 32, n = 16;
  const Tensor x = leaf({3, 13, k}, 1.0, 1, kCPU), w = leaf({n, k}, 0.05, 2, kCPU), w2 = leaf({n, k}, 0.05, 2, kCPU);
  const Tensor g = randn({3, 13, n}) * 1e-3;
  const Tensor y = fp8_linear(x, w, Tensor(), std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(), kCPU));
  y.backward(g);
  const Tensor xp = cat({raw::reshape(x.detach(), {39, k}), zeros({9, k})}, 0).requires_grad_(true);
  const Tensor yp = fp8_linear(xp, w2, Tensor(), std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(), kCPU));
  yp.backward(cat({raw::reshape(g, {39, n}), zeros({9, n})}, 0));
  EXPECT_EQ(y.shape(), (Shape{3, 13, n}));
  EXPECT_EQ(floats(y), floats(yp.narrow(0, 0, 39)));
  EXPECT_EQ(floats(x.grad()), floats(xp.grad().narrow(0, 0, 39)));
  EXPECT_EQ(floats(w.grad()), floats(w2.grad()));
  // No rows at all: an empty output and gradient, a zero weight gradient.
  const Tensor none = leaf({0, k}, 1.0, 3, kCPU);
  const Tensor y0 = fp8_linear(none, w, Tensor(), std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(), kCPU));
  EXPECT_EQ(y0.shape(), (Shape{0, n}));
  w.grad().zero_();
  sum(y0).backward();
  EXPECT_EQ(none.grad().shape(), (Shape{0, k}));
  EXPECT_EQ(floats(w.grad()), std::vector<float>(static_cast<size_t>(n * k), 0.0f));
}

TEST(Fp8Linear, WeightShapesThatAreNotMultiplesOf16FallBackWithOneWarning) {
  const Tensor x = leaf({8, 24}, 1.0, 1, kCPU), w = leaf({40, 24}, 0.1, 2, kCPU);
  const auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(), kCPU);
  AutocastGuard amp(DeviceType::cpu, DType::bf16);
  ::testing::internal::CaptureStderr();
  const Tensor y = fp8_linear(x, w, Tensor(), state);
  const std::string first = ::testing::internal::GetCapturedStderr();
  ::testing::internal::CaptureStderr();
  fp8_linear(x, w, Tensor(), state);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "once per reason";
  expect_contains(first, {"warning", "fp8_linear", "[40, 24]", "multiples of 16", "linear()"});
  EXPECT_EQ(floats(y), floats(linear(x, w)));
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(head(state->input), 0.0f) << "nothing was cast";
}

TEST(Fp8Linear, ErrorsNameTheProblem) {
  const Tensor x = leaf({16, 32}, 1.0, 1, kCPU), w = leaf({16, 32}, 0.1, 2, kCPU);
  const auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(), kCPU);
  expect_contains(error_of([&] { fp8_linear(x, w, Tensor(), nullptr); }), {"fp8_linear", "no Fp8LinearState"});
  expect_contains(error_of([&] {
                    fp8_linear(x, leaf({16, 48}, 1.0, 3, kCPU), Tensor(), state);
                  }),
                  {"fp8_linear", "f32[16, 32]", "[16, 48]", "cannot be multiplied"});
  expect_contains(error_of([&] { fp8_linear(x, w, zeros({8}), state); }), {"fp8_linear", "bias must be [16]", "[8]"});
  expect_contains(error_of([&] { checkpoint([&](const Tensor& t) { return fp8_linear(t, w, Tensor(), state); }, x); }),
                  {"fp8_linear", "gradient-checkpointed segment", "selective"});
  expect_contains(error_of([&] { Fp8AutocastGuard guard(DeviceType::cpu, Fp8Recipe::delayed(0)); }),
                  {"history_len", "0"});
  expect_contains(error_of([&] { Fp8AutocastGuard guard(DeviceType::cpu, Fp8Recipe::current(100)); }),
                  {"margin", "100"});
}

TEST(Fp8Linear, StateSavesAndRestores) {
  const Fp8Recipe recipe = Fp8Recipe::delayed(4, DelayedScaling::Amax::most_recent, 1);
  const auto a = std::make_shared<Fp8LinearState>(recipe, kCPU);
  const Tensor w = leaf({16, 32}, 0.05, 1, kCPU);
  for (uint64_t s = 0; s < 2; ++s) sum(fp8_linear(leaf({16, 32}, 1.0, s, kCPU), w, Tensor(), a)).backward();
  const std::map<std::string, Tensor> saved = a->state_dict();
  EXPECT_EQ(saved.size(), 10u);
  EXPECT_EQ(Fp8LinearState::saved_recipe(saved), recipe);
  Fp8LinearState b(recipe, kCPU);
  b.load_state_dict(saved);
  for (const auto& [key, t] : b.state_dict()) EXPECT_EQ(floats(t), floats(saved.at(key))) << key;
  EXPECT_FALSE(b.weight_cache.q.defined()) << "the cache is not state";
  // Current scaling keeps nothing but its recipe.
  EXPECT_EQ(Fp8LinearState(Fp8Recipe::current(2), kCPU).state_dict().size(), 1u);

  Fp8LinearState other(Fp8Recipe::delayed(4), kCPU);
  expect_contains(error_of([&] { other.load_state_dict(saved); }),
                  {"saved under delayed scaling (history 4, amax most_recent, margin 1)",
                   "follows delayed scaling (history 4, amax max, margin 0)"});
  std::map<std::string, Tensor> missing = saved;
  missing.erase("grad_output.scale");
  expect_contains(error_of([&] { b.load_state_dict(missing); }), {"missing key 'grad_output.scale'"});
  std::map<std::string, Tensor> extra = saved;
  extra["bias.scale"] = ones({1});
  expect_contains(error_of([&] { b.load_state_dict(extra); }), {"unexpected key 'bias.scale'"});
  std::map<std::string, Tensor> bad = saved;
  bad["recipe"] = from_vector({0, 4, 7, 0}, {4}, DType::i64);
  expect_contains(error_of([&] { b.load_state_dict(bad); }), {"recipe", "unknown"});
}

TEST(Fp8Autocast, GuardsNestAndRestore) {
  EXPECT_FALSE(fp8_autocast_enabled(DeviceType::cpu));
  {
    Fp8AutocastGuard outer(DeviceType::cpu, Fp8Recipe::current(2));
    EXPECT_TRUE(fp8_autocast_enabled(DeviceType::cpu));
    EXPECT_FALSE(fp8_autocast_enabled(DeviceType::cuda));
    EXPECT_EQ(fp8_autocast_recipe(DeviceType::cpu), Fp8Recipe::current(2));
    {
      Fp8AutocastGuard off(DeviceType::cpu, Fp8Recipe::delayed(), /*enabled=*/false);
      EXPECT_FALSE(fp8_autocast_enabled(DeviceType::cpu));
    }
    EXPECT_TRUE(fp8_autocast_enabled(DeviceType::cpu));
    EXPECT_EQ(fp8_autocast_recipe(DeviceType::cpu).str(), "current scaling (margin 2)");
  }
  EXPECT_FALSE(fp8_autocast_enabled(DeviceType::cpu));
  EXPECT_EQ(Fp8Recipe().str(), "delayed scaling (history 16, amax max, margin 0)");
  EXPECT_NE(Fp8Recipe::delayed(16), Fp8Recipe::delayed(16, DelayedScaling::Amax::most_recent));
  EXPECT_EQ(Fp8Recipe::current(), Fp8Recipe::current());
}

struct LinearRun {
  std::vector<float> y, dx, dw, db;
  DType y_dtype;
};

// One forward and backward of `layer` under bf16 autocast, with `open` opening what else is wanted.
template <typename Open>
LinearRun run_linear(const nn::Linear& layer, Device device, Open&& open) {
  const Tensor x = leaf({2, 16, 32}, 1.0, 5, device);
  for (Tensor p : layer.parameters()) p.set_grad(Tensor());
  Tensor y;
  {
    AutocastGuard amp(device.type, DType::bf16);
    const auto guard = open();
    y = layer.forward(x);
  }
  y.backward(ones(y.shape(), TensorOptions().dtype(y.dtype()).device(device)) * 1e-2);
  return {floats(y), floats(x.grad()), floats(layer.weight.grad()), floats(layer.bias.grad()), y.dtype()};
}

void expect_same_run(const LinearRun& a, const LinearRun& b, const std::string& what) {
  EXPECT_EQ(a.y, b.y) << what;
  EXPECT_EQ(a.dx, b.dx) << what;
  EXPECT_EQ(a.dw, b.dw) << what;
  EXPECT_EQ(a.db, b.db) << what;
  EXPECT_EQ(a.y_dtype, b.y_dtype) << what;
}

// Off (no guard, a disabled one, or an excluded layer), Linear is today's linear() bit for bit and
// makes no FP8 state; on, it is fp8_linear with its own state.
void expect_linear_under_the_guard(Device device) {
  Generator gen(3);
  nn::Linear layer(nn::LinearOptions(32, 48), &gen);
  layer.to(device);
  const auto none = [] { return std::unique_ptr<Fp8AutocastGuard>(); };
  const LinearRun today = run_linear(layer, device, none);
  expect_same_run(
      today,
      run_linear(layer, device,
                 [&] { return std::make_unique<Fp8AutocastGuard>(device.type, Fp8Recipe(), /*enabled=*/false); }),
      "disabled guard");
  layer.fp8_excluded = true;
  const auto on = [&] { return std::make_unique<Fp8AutocastGuard>(device.type, Fp8Recipe::current()); };
  expect_same_run(today, run_linear(layer, device, on), "excluded layer");
  EXPECT_EQ(layer.fp8_state, nullptr);
  layer.fp8_excluded = false;

  const LinearRun fp8 = run_linear(layer, device, on);
  ASSERT_NE(layer.fp8_state, nullptr);
  EXPECT_EQ(layer.fp8_state->recipe, Fp8Recipe::current());
  EXPECT_EQ(fp8.y_dtype, DType::bf16) << "the autocast dtype";
  EXPECT_NE(fp8.y, today.y);
  const Tensor x = leaf({2, 16, 32}, 1.0, 5, device);
  AutocastGuard amp(device.type, DType::bf16);
  EXPECT_EQ(fp8.y, floats(fp8_linear(x, layer.weight, layer.bias, layer.fp8_state)));
  EXPECT_EQ(layer.weight.grad().dtype(), DType::f32) << "the master weight's gradient straight from the GEMM";
  // A layer keeps its recipe: another one is an error, not a silent restart.
  Fp8AutocastGuard other(device.type, Fp8Recipe::delayed());
  expect_contains(error_of([&] { layer.forward(x); }),
                  {"Linear", "follows current scaling (margin 0)", "asks for delayed scaling"});
}

TEST(Fp8Autocast, LinearIsUnchangedWhenOffAndFp8WhenOn) { expect_linear_under_the_guard(kCPU); }

// fp8_state_dict of a Linear itself: its keys have no path; loading makes the other layer's state.
TEST(Fp8Autocast, ALinearsStateDictRoundTrips) {
  nn::Linear a(nn::LinearOptions(32, 16)), b(nn::LinearOptions(32, 16));
  EXPECT_TRUE(nn::fp8_state_dict(a).empty());
  {
    Fp8AutocastGuard fp8(DeviceType::cpu, Fp8Recipe::delayed(2));
    a.forward(leaf({16, 32}, 1.0, 1, kCPU));
  }
  const std::map<std::string, Tensor> saved = nn::fp8_state_dict(a);
  EXPECT_EQ(saved.count("recipe"), 1u);
  EXPECT_EQ(saved.count("input.amax_history"), 1u);
  nn::load_fp8_state_dict(b, saved);
  ASSERT_NE(b.fp8_state, nullptr);
  EXPECT_EQ(b.fp8_state->recipe, Fp8Recipe::delayed(2));
  EXPECT_EQ(history(b.fp8_state->input), history(a.fp8_state->input));
  nn::load_fp8_state_dict(b, {});
  EXPECT_EQ(b.fp8_state, nullptr) << "no entries: no state, as the saved layer had none";
  std::map<std::string, Tensor> broken = saved;
  broken.erase("weight.scale");
  expect_contains(error_of([&] { nn::load_fp8_state_dict(a, broken); }),
                  {"load_fp8_state_dict", "missing key 'weight.scale'"});
  EXPECT_NE(a.fp8_state, nullptr) << "a failed load changes nothing";
}

// ---- CUDA ----

TEST(Fp8LinearCuda, ForwardAndGradientsStayWithinTheRoundingBound) {
  MT_SKIP_WITHOUT_CUDA();
  expect_within_bound(gpu(), {64, 96}, 48);
  expect_within_bound(gpu(), {3, 13, 64}, 32);
  expect_within_bound(gpu(), {256, 512}, 1024);
}

TEST(Fp8LinearCuda, IsItsPrimitivesComposedBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  expect_primitives_bit_for_bit(gpu());
}

TEST(Fp8LinearCuda, DelayedScalingMovesAtEachCast) {
  MT_SKIP_WITHOUT_CUDA();
  expect_delayed_update_points(gpu());
}

TEST(Fp8LinearCuda, StatesMatchTheCpuBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  // The amaxes are exact on both devices, so the histories and scales agree bit for bit.
  std::vector<std::shared_ptr<Fp8LinearState>> states;
  for (const Device device : {kCPU, gpu()}) {
    auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::delayed(4), device);
    const Tensor w = leaf({48, 64}, 0.05, 1, device);
    for (uint64_t s = 0; s < 3; ++s) {
      fp8_linear(leaf({32, 64}, 1.0, 10 + s, device), w, Tensor(), state).backward(ones({32, 48}, device) * 1e-3);
    }
    states.push_back(state);
  }
  for (const auto& [key, t] : states[0]->state_dict())
    EXPECT_EQ(floats(t), floats(states[1]->state_dict().at(key))) << key;
}

TEST(Fp8AutocastCuda, LinearIsUnchangedWhenOffAndFp8WhenOn) {
  MT_SKIP_WITHOUT_CUDA();
  expect_linear_under_the_guard(gpu());
}

// A layer moved to the GPU after its first FP8 forward takes its state along (histories kept).
TEST(Fp8AutocastCuda, ALayerMovedToTheGpuTakesItsStateAlong) {
  MT_SKIP_WITHOUT_CUDA();
  nn::Linear layer(nn::LinearOptions(32, 16));
  Fp8AutocastGuard fp8_cpu(DeviceType::cpu, Fp8Recipe::delayed(4));
  Fp8AutocastGuard fp8_cuda(DeviceType::cuda, Fp8Recipe::delayed(4));
  layer.forward(leaf({16, 32}, 1.0, 1, kCPU));
  const std::vector<float> before = history(layer.fp8_state->input);
  layer.to(gpu());
  const Tensor x = leaf({16, 32}, 1.0, 2, gpu());
  layer.forward(x);
  EXPECT_EQ(layer.fp8_state->device, gpu());
  EXPECT_EQ(history(layer.fp8_state->input), (std::vector<float>{amax(x), before[0], 0.0f, 0.0f}));
}

// A captured forward casts the weight in the graph: a replay after the weight changed in place
// reads the new weight (the cache, filled before the capture, is neither read nor filled in it).
TEST(Fp8LinearCuda, GraphReplaysCastTheWeightAsItIsAtEachReplay) {
  MT_SKIP_WITHOUT_CUDA();
  NoGradGuard no_grad;
  const Tensor x = leaf({32, 64}, 1.0, 1, gpu()).detach(), w = leaf({48, 64}, 0.05, 2, gpu()).detach();
  const auto state = std::make_shared<Fp8LinearState>(Fp8Recipe::current(), gpu());
  fp8_linear(x, w, Tensor(), state);  // the cache now holds q(W)
  const Tensor out = empty({32, 48}, TensorOptions().dtype(DType::f32).device(gpu()));
  const cuda::Stream stream = cuda::current_stream(gpu().index);
  cuda::Graph graph;
  graph.capture(stream, [&] { out.copy_(fp8_linear(x, w, Tensor(), state)); });
  for (int i = 0; i < 2; ++i) {
    if (i == 1) w.copy_(w * 2.0);
    graph.replay(stream);
    const auto eager = std::make_shared<Fp8LinearState>(Fp8Recipe::current(), gpu());
    EXPECT_EQ(floats(out), floats(fp8_linear(x, w, Tensor(), eager))) << "replay " << i;
  }
}

}  // namespace
}  // namespace mt::testing
