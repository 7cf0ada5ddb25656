// FP8 (ops/fp8): the cast against hand-computed tables (ties to even, saturation, NaN,
// subnormals), its transposed layout and amax; dequantization and the round trip; delayed and
// current scaling against hand-computed sequences, and their state's save and restore; the GEMM's
// emulation against f64 with derived bounds, and its contract's errors. CUDA: every cast, scale
// update and emulated GEMM bit for bit (or to the accumulation order) against the CPU, the
// native cuBLASLt GEMM against the emulation, and a linear layer's three GEMMs against f64.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/view.h"
#include "ops/fp8/fp8.h"
#include "ops/fp8/fp8_scaling.h"
#include "tests/ops/fp8_test_util.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The stored bytes of an FP8 tensor.
std::vector<uint8_t> bytes_of(const Tensor& q) {
  const Tensor h = raw::contiguous(raw::to(q, kCPU));
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.numel());
}
Tensor fp8_tensor(const std::vector<uint8_t>& b, const Shape& shape, DType format, Device device = kCPU) {
  return from_blob(b.data(), shape, format, TensorOptions().dtype(format).device(device));
}
uint32_t amax_bits(const Tensor& amax) { return bits_of(amax.to(kCPU).to_vector<float>()[0]); }

struct Case {
  float x;
  uint8_t want;
};

// x * scale through quantize_fp8 on `device`, each case against its byte.
void expect_table(const std::vector<Case>& table, DType format, float scale, Device device) {
  std::vector<float> xs;
  for (const Case& c : table) xs.push_back(c.x);
  const Tensor x = f32_tensor(xs, {static_cast<int64_t>(xs.size())}, device);
  const std::vector<uint8_t> got = bytes_of(quantize_fp8(x, f32_scalar(scale, device), format).data);
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(static_cast<int>(got[i]), static_cast<int>(table[i].want))
        << dtype_name(format) << " x = " << table[i].x << " (bits 0x" << std::hex << bits_of(table[i].x) << ") scale "
        << std::dec << scale << " on " << device.str();
  }
}

// E4M3 (fn): bias 7, 3 mantissa bits, max 448 = 0x7e, NaN S.1111.111, subnormals k * 2^-9.
std::vector<Case> e4m3_table() {
  const float s = std::ldexp(1.0f, -9);  // the smallest subnormal
  return {
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {1.0f, 0x38},
      {-1.0f, 0xb8},
      {0.75f, 0x34},
      {240.0f, 0x77},
      {256.0f, 0x78},
      {416.0f, 0x7d},
      {1.0625f, 0x38},                        // halfway 1 | 1.125: to even (1)
      {std::nextafter(1.0625f, 2.0f), 0x39},  // just above halfway: up
      {1.1875f, 0x3a},                        // halfway 1.125 | 1.25: to even (1.25)
      {432.0f, 0x7e},                         // halfway 416 | 448: to even (448)
      {448.0f, 0x7e},
      {449.0f, 0x7e},  // saturation
      {464.0f, 0x7e},
      {480.0f, 0x7e},
      {1e6f, 0x7e},
      {-1e6f, 0xfe},
      {kInf, 0x7e},
      {-kInf, 0xfe},  // infinities saturate too
      {kNaN, 0x7f},
      {-kNaN, 0xff},  // NaN keeps its sign
      {s, 0x01},
      {-s, 0x81},     // subnormals
      {s / 2, 0x00},  // halfway 0 | 2^-9: to even (0)
      {std::nextafter(s / 2, 1.0f), 0x01},
      {3 * s / 2, 0x02},
      {5 * s / 2, 0x02},   // 1.5 -> 2, 2.5 -> 2
      {7 * s, 0x07},       // the largest subnormal
      {15 * s / 2, 0x08},  // halfway 7 | 8 (= 2^-6, normal): 8
      {std::ldexp(1.0f, -6), 0x08},
      {1e-30f, 0x00},
      {-1e-30f, 0x80},  // underflow keeps the sign
  };
}

// E5M2: bias 15, 2 mantissa bits, max 57344 = 0x7b, infinities, subnormals k * 2^-16.
std::vector<Case> e5m2_table() {
  const float s = std::ldexp(1.0f, -16);
  return {
      {0.0f, 0x00},      {-0.0f, 0x80},    {1.0f, 0x3c},
      {-2.0f, 0xc0},     {1.75f, 0x3f},    {1.125f, 0x3c},    // halfway 1 | 1.25: to even (1)
      {1.375f, 0x3e},                                         // halfway 1.25 | 1.5: to even (1.5)
      {57344.0f, 0x7b},  {61439.0f, 0x7b}, {61440.0f, 0x7b},  // saturation, not inf
      {1e9f, 0x7b},      {-1e9f, 0xfb},    {kInf, 0x7b},
      {-kInf, 0xfb},     {kNaN, 0x7e},     {-kNaN, 0xfe},  // quiet NaN, sign kept
      {s, 0x01},         {-s, 0x81},       {s / 2, 0x00},
      {3 * s / 2, 0x02}, {3 * s, 0x03},    {std::ldexp(1.0f, -14), 0x04},
  };
}

void expect_tables(Device device) {
  expect_table(e4m3_table(), DType::f8e4m3, 1.0f, device);
  expect_table(e5m2_table(), DType::f8e5m2, 1.0f, device);
  // The scale multiplies before the rounding: 3 * 0.25 = 0.75, 100 * 8 = 800 saturates, 1 * 2^-9.
  expect_table({{3.0f, 0x34}, {-3.0f, 0xb4}}, DType::f8e4m3, 0.25f, device);
  expect_table({{100.0f, 0x7e}, {-100.0f, 0xfe}, {kNaN, 0x7f}, {-kNaN, 0xff}}, DType::f8e4m3, 8.0f, device);
  expect_table({{1.0f, 0x01}, {0.5f, 0x00}}, DType::f8e4m3, std::ldexp(1.0f, -9), device);
}

TEST(Fp8Quantize, MatchesHandComputedTables) { expect_tables(kCPU); }

void expect_amax(Device device) {
  const auto amax_of = [&](const std::vector<float>& v, float scale) {
    return quantize_fp8(f32_tensor(v, {static_cast<int64_t>(v.size())}, device), f32_scalar(scale, device),
                        DType::f8e4m3)
        .amax.to(kCPU)
        .to_vector<float>()[0];
  };
  EXPECT_EQ(amax_of({-3.5f, 2.0f, 0.25f, -0.0f}, 1.0f), 3.5f);
  EXPECT_EQ(amax_of({-3.5f, 2.0f, 1e6f}, 4.0f), 1e6f);  // before scaling, and past the format's range
  EXPECT_EQ(amax_of({1.0f, -kInf}, 1.0f), kInf);
  EXPECT_TRUE(std::isnan(amax_of({1.0f, kNaN, -kInf}, 1.0f)));
  EXPECT_TRUE(std::isnan(amax_of({-kNaN, 5.0f}, 1.0f)));
  EXPECT_EQ(amax_of({0.1f}, 1.0f), 0.1f);  // exact: the f32 value itself
  const Tensor empty_x = empty({0, 8}, TensorOptions().dtype(DType::f32).device(device));
  EXPECT_EQ(quantize_fp8(empty_x, f32_scalar(1.0f, device), DType::f8e4m3).amax.to(kCPU).to_vector<float>()[0], 0.0f);
  EXPECT_EQ(fp8_amax(f32_tensor({-7.0f, 3.0f}, {2}, device)).to(kCPU).to_vector<float>()[0], 7.0f);
}

TEST(Fp8Quantize, AmaxIsExactAndPropagatesNaN) { expect_amax(kCPU); }

// x [M, K] random in `dtype`, cast plain, transposed and both: the transposed bytes are the plain
// ones transposed, both gives the two; the amax is the same.
void expect_transpose_consistent(Device device, DType dtype, int64_t m, int64_t k, DType format) {
  Generator gen(static_cast<uint64_t>(m * 1000 + k));
  const Tensor x = raw::to(randn({m, k}, DType::f32, &gen) * 40.0, device).to(dtype);
  const Tensor scale = f32_scalar(3.0f, device);
  const Fp8Quantized plain = quantize_fp8(x, scale, format);
  const Fp8Quantized trans = quantize_fp8(x, scale, format, Fp8Layout::transposed);
  ASSERT_EQ(trans.data.shape(), (Shape{k, m}));
  const std::vector<uint8_t> p = bytes_of(plain.data), t = bytes_of(trans.data);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(t[static_cast<size_t>(j * m + i)], p[static_cast<size_t>(i * k + j)])
          << dtype_name(dtype) << " [" << m << ", " << k << "] at (" << i << ", " << j << ") on " << device.str();
    }
  }
  EXPECT_EQ(amax_bits(plain.amax), amax_bits(trans.amax));
  // Both layouts from one pass: the same bytes as the two separate casts, the same amax.
  const Fp8Quantized both = quantize_fp8(x, scale, format, Fp8Layout::both);
  ASSERT_EQ(both.data.shape(), (Shape{m, k}));
  ASSERT_EQ(both.data_t.shape(), (Shape{k, m}));
  EXPECT_EQ(bytes_of(both.data), p) << dtype_name(dtype) << " [" << m << ", " << k << "] on " << device.str();
  EXPECT_EQ(bytes_of(both.data_t), t) << dtype_name(dtype) << " [" << m << ", " << k << "] on " << device.str();
  EXPECT_EQ(amax_bits(both.amax), amax_bits(plain.amax));
  EXPECT_FALSE(plain.data_t.defined());
  EXPECT_FALSE(trans.data_t.defined());
}

TEST(Fp8Quantize, TransposedIsTheTransposeOfThePlainCast) {
  expect_transpose_consistent(kCPU, DType::f32, 67, 131, DType::f8e4m3);
  expect_transpose_consistent(kCPU, DType::bf16, 64, 128, DType::f8e5m2);
}

void expect_dequantize(Device device) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) codes.push_back(static_cast<uint8_t>(c));
  for (const DType format : {DType::f8e4m3, DType::f8e5m2}) {
    const Tensor q = fp8_tensor(codes, {256}, format, device);
    const std::vector<float> values = raw::to(q, DType::f32).to(kCPU).to_vector<float>();  // the codes' values
    const std::vector<float> got = dequantize_fp8(q, f32_scalar(4.0f, device), DType::f32).to(kCPU).to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(values[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "code " << i;
      } else {
        EXPECT_EQ(got[i], values[i] / 4.0f) << dtype_name(format) << " code " << i << " on " << device.str();
      }
    }
  }
  // The round trip: x through the E4M3 value set at scale 8, in x's dtype.
  const Tensor x = f32_tensor({1.0f, 0.13f, -30.0f, 100.0f}, {4}, device).to(DType::bf16);
  const Tensor y = fp8_round_trip(x, f32_scalar(8.0f, device), DType::f8e4m3);
  EXPECT_EQ(y.dtype(), DType::bf16);
  // 0.13 * 8 = 1.04 -> 1 -> 0.125; 100 * 8 = 800 saturates to 448 -> 56.
  const std::vector<double> want = {1.0, 0.125, -30.0, 56.0};
  EXPECT_EQ(y.to(kCPU).to_vector<double>(), want);
}

TEST(Fp8Quantize, DequantizeDividesByTheScale) { expect_dequantize(kCPU); }

TEST(Fp8Quantize, ErrorsNameTheProblem) {
  const Tensor x = zeros({4, 4});
  const Tensor one = f32_scalar(1.0f);
  expect_contains(error_of([&] { quantize_fp8(x, one, DType::bf16); }), {"quantize_fp8", "f8e4m3 or f8e5m2", "bf16"});
  expect_contains(error_of([&] { quantize_fp8(x, zeros({2}), DType::f8e4m3); }), {"quantize_fp8", "scale", "f32[2]"});
  expect_contains(error_of([&] { quantize_fp8(x, ones({1}, DType::f64), DType::f8e4m3); }), {"scale", "f64[1]"});
  expect_contains(error_of([&] {
                    quantize_fp8(zeros({2, 2, 2}), one, DType::f8e4m3, Fp8Layout::transposed);
                  }),
                  {"quantize_fp8", "2-D", "[2, 2, 2]"});
  expect_contains(error_of([&] { quantize_fp8(zeros({4}, DType::i32), one, DType::f8e4m3); }), {"i32"});
  expect_contains(error_of([&] { dequantize_fp8(x, one, DType::f32); }), {"dequantize_fp8", "f8e4m3 or f8e5m2"});
  const Tensor q = quantize_fp8(x, one, DType::f8e4m3).data;
  expect_contains(error_of([&] { dequantize_fp8(q, one, DType::i64); }), {"dequantize_fp8", "i64"});
  EXPECT_EQ(fp8_max(DType::f8e4m3), 448.0f);
  EXPECT_EQ(fp8_max(DType::f8e5m2), 57344.0f);
  expect_contains(error_of([&] { fp8_max(DType::f16); }), {"fp8_max", "f16"});
}

// ---- scaling ----

struct Step {
  float amax;
  float scale;  // expected after the update
};

// Runs `steps` through one state on `device`, checking scale, scale_inv and the history's head.
void expect_sequence(const DelayedScaling& recipe, const std::vector<Step>& steps, Device device) {
  Fp8TensorState state(recipe, device);
  EXPECT_EQ(state.scale.to(kCPU).to_vector<float>(), std::vector<float>{1.0f});
  for (size_t i = 0; i < steps.size(); ++i) {
    state.update(f32_scalar(steps[i].amax, device));
    const float scale = state.scale.to(kCPU).to_vector<float>()[0];
    EXPECT_EQ(scale, steps[i].scale) << "step " << i << " (amax " << steps[i].amax << ") on " << device.str();
    EXPECT_EQ(state.scale_inv.to(kCPU).to_vector<float>()[0], 1.0f / steps[i].scale) << "step " << i;
    const float head = state.amax_history.to(kCPU).to_vector<float>()[0];
    EXPECT_EQ(bits_of(head), bits_of(steps[i].amax)) << "step " << i;
  }
}

void expect_delayed_scaling(Device device) {
  DelayedScaling recipe;
  recipe.history_len = 3;
  // max over the last three amaxes; 448 / amax.
  expect_sequence(recipe,
                  {{2.0f, 224.0f},   // [2, 0, 0]
                   {8.0f, 56.0f},    // [8, 2, 0]
                   {1.0f, 56.0f},    // [1, 8, 2]
                   {0.5f, 56.0f},    // [0.5, 1, 8]
                   {0.25f, 448.0f},  // [0.25, 0.5, 1]: the 8 has rolled off
                   {0.0f, 896.0f},   // [0, 0.25, 0.5]
                   {0.0f, 1792.0f},  // [0, 0, 0.25]
                   {0.0f, 1792.0f},  // [0, 0, 0]: amax 0 keeps the scale
                   {kNaN, 1792.0f},  // NaN drops out of the max (fmaxf): still 0
                   {kInf, 1792.0f},  // an inf in the history keeps the scale while it stays
                   {1.0f, 1792.0f},  // [1, inf, NaN]
                   {2.0f, 1792.0f},  // [2, 1, inf]
                   {4.0f, 112.0f}},  // [4, 2, 1]
                  device);
  recipe.amax_compute = DelayedScaling::Amax::most_recent;
  expect_sequence(
      recipe,
      {{2.0f, 224.0f}, {8.0f, 56.0f}, {1.0f, 448.0f}, {0.0f, 448.0f}, {kNaN, 448.0f}, {kInf, 448.0f}, {4.0f, 112.0f}},
      device);
  recipe.margin = 2;  // (448 / amax) / 4
  expect_sequence(recipe, {{2.0f, 56.0f}, {7.0f, 16.0f}}, device);
  recipe = DelayedScaling();
  recipe.format = DType::f8e5m2;
  recipe.history_len = 1;
  recipe.margin = -1;  // a negative margin doubles the scale
  expect_sequence(recipe, {{1024.0f, 112.0f}, {std::ldexp(1.0f, -130), FLT_MAX}}, device);  // 57344 * 2 / 1024
}

TEST(Fp8Scaling, DelayedScalingFollowsTheHandComputedSequence) { expect_delayed_scaling(kCPU); }

void expect_current_scale(Device device) {
  const auto scale_for = [&](float amax, DType format, int margin) {
    const Fp8Scale s = current_scale(f32_scalar(amax, device), format, margin);
    const float scale = s.scale.to(kCPU).to_vector<float>()[0];
    EXPECT_EQ(s.scale_inv.to(kCPU).to_vector<float>()[0], 1.0f / scale);
    return scale;
  };
  EXPECT_EQ(scale_for(2.0f, DType::f8e4m3, 0), 224.0f);
  EXPECT_EQ(scale_for(2.0f, DType::f8e4m3, 3), 28.0f);
  EXPECT_EQ(scale_for(3.0f, DType::f8e4m3, 0), 448.0f / 3.0f);
  EXPECT_EQ(scale_for(57344.0f, DType::f8e5m2, 0), 1.0f);
  EXPECT_EQ(scale_for(0.0f, DType::f8e4m3, 0), 1.0f);  // no information: 1
  EXPECT_EQ(scale_for(kInf, DType::f8e4m3, 0), 1.0f);
  EXPECT_EQ(scale_for(kNaN, DType::f8e4m3, 0), 1.0f);
  EXPECT_EQ(scale_for(1e-40f, DType::f8e4m3, 0), FLT_MAX);  // 448 / 1e-40 overflows f32
  // Just-in-time: the amax of x, then the cast maps it onto 448 exactly.
  const Tensor x = f32_tensor({0.5f, -3.0f, 1.5f}, {3}, device);
  const Fp8Scale s = current_scale(fp8_amax(x), DType::f8e4m3);
  EXPECT_EQ(bytes_of(quantize_fp8(x, s.scale, DType::f8e4m3).data)[1], 0xfe);  // -3 -> -448
}

TEST(Fp8Scaling, CurrentScaleMapsTheAmaxOntoTheFormatsMax) { expect_current_scale(kCPU); }

TEST(Fp8Scaling, StateSavesAndRestores) {
  DelayedScaling recipe;
  recipe.history_len = 4;
  Fp8TensorState a(recipe, kCPU), b(recipe, kCPU);
  for (const float amax : {3.0f, 1.0f, 6.0f}) a.update(f32_scalar(amax));
  const std::map<std::string, Tensor> saved = a.state_dict();
  ASSERT_EQ(saved.size(), 3u);
  b.load_state_dict({{"amax_history", saved.at("amax_history").clone()},
                     {"scale", saved.at("scale").clone()},
                     {"scale_inv", saved.at("scale_inv").to(DType::f64)}});  // converted to f32
  EXPECT_EQ(b.amax_history.to_vector<float>(), (std::vector<float>{6.0f, 1.0f, 3.0f, 0.0f}));
  EXPECT_EQ(b.scale.to_vector<float>(), a.scale.to_vector<float>());
  EXPECT_EQ(b.scale_inv.to_vector<float>(), a.scale_inv.to_vector<float>());
  a.update(f32_scalar(1.0f));
  b.update(f32_scalar(1.0f));  // the restored state goes on as the saved one does
  EXPECT_EQ(b.amax_history.to_vector<float>(), a.amax_history.to_vector<float>());
  EXPECT_EQ(b.scale.to_vector<float>(), a.scale.to_vector<float>());

  std::map<std::string, Tensor> missing = saved;
  missing.erase("scale");
  expect_contains(error_of([&] { b.load_state_dict(missing); }), {"load_state_dict", "missing", "scale"});
  std::map<std::string, Tensor> extra = saved;
  extra["amax"] = zeros({1});
  expect_contains(error_of([&] { b.load_state_dict(extra); }), {"unexpected", "amax"});
  std::map<std::string, Tensor> shorter = saved;
  shorter["amax_history"] = zeros({16});
  expect_contains(error_of([&] { b.load_state_dict(shorter); }), {"amax_history", "4 elements", "f32[16]"});
  std::map<std::string, Tensor> ints = saved;
  ints["scale"] = ones({1}, DType::i32);
  expect_contains(error_of([&] { b.load_state_dict(ints); }), {"scale", "i32"});
}

TEST(Fp8Scaling, ErrorsNameTheProblem) {
  DelayedScaling bad;
  bad.history_len = 0;
  expect_contains(error_of([&] { (void)Fp8TensorState(bad, kCPU); }), {"history_len", "0"});
  bad = DelayedScaling();
  bad.format = DType::bf16;
  expect_contains(error_of([&] { (void)Fp8TensorState(bad, kCPU); }), {"f8e4m3 or f8e5m2", "bf16"});
  Fp8TensorState state(DelayedScaling(), kCPU);
  expect_contains(error_of([&] { state.update(zeros({2})); }), {"update", "amax", "f32[2]"});
  expect_contains(error_of([&] { state.update(Tensor()); }), {"update", "undefined"});
  expect_contains(error_of([&] { current_scale(ones({1}), DType::f16); }), {"f16"});
}

// ---- GEMM ----

// Random values cast at scale 1: already on the format's grid.
Tensor on_grid(const Shape& shape, DType format, uint64_t seed) {
  Generator gen(seed);
  return quantize_fp8(randn(shape, DType::f32, &gen) * 4.0, f32_scalar(1.0f), format).data;
}

// Inputs already on the FP8 grid: every product is exact in f32, so the only errors are the f32
// additions, the two multiplications by the scales and the bias's addition. With u = 2^-24 and
// S_ij = s * sum_k |a_ik b_jk| + |bias_j| (s = scale_inv_a * scale_inv_b), the classic bound for a
// recursively summed product is |y - y_ref| <= gamma(K + 3) S_ij, gamma(n) = n u / (1 - n u);
// a bf16 output adds its rounding, 2^-8 |y_ref|.
void expect_on_grid_gemm(DType fa, DType fb, DType out_dtype, bool with_bias, Fp8Compute compute, Device device) {
  const int64_t m = 32, n = 48, k = 64;
  const Tensor a = on_grid({m, k}, fa, 1), b = on_grid({n, k}, fb, 2);
  const float sa = 0.37f, sb = 3.1f;
  Generator gen(3);
  const Tensor bias = with_bias ? randn({n}, DType::f32, &gen).to(DType::bf16) : Tensor();
  Tensor amax;
  const Tensor y = fp8_gemm(a.to(device), b.to(device), f32_scalar(sa, device), f32_scalar(sb, device), out_dtype,
                            with_bias ? bias.to(device) : Tensor(), &amax, compute);
  ASSERT_EQ(y.shape(), (Shape{m, n}));
  ASSERT_EQ(y.dtype(), out_dtype);
  ASSERT_EQ(y.device(), device);
  const std::vector<double> av = values_of(a), bv = values_of(b), got = values_of(y);
  const std::vector<double> bias_v = with_bias ? values_of(bias) : std::vector<double>(n, 0.0);
  const double s = static_cast<double>(sa) * static_cast<double>(sb);
  double ref_amax = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, mag = 0;
      for (int64_t l = 0; l < k; ++l) {
        dot += av[i * k + l] * bv[j * k + l];
        mag += std::abs(av[i * k + l] * bv[j * k + l]);
      }
      const double ref = s * dot + bias_v[j];
      double bound = gamma(k + 3) * (s * mag + std::abs(bias_v[j]));
      if (out_dtype == DType::bf16) bound += kUBf16 * (std::abs(ref) + bound);
      ASSERT_LE(std::abs(got[i * n + j] - ref), bound) << "(" << i << ", " << j << ") ref " << ref;
      ref_amax = std::max(ref_amax, std::abs(ref));
    }
  }
  ASSERT_TRUE(amax.defined());
  // The amax is taken before the rounding to out_dtype: within the f32 bound of the reference's.
  EXPECT_NEAR(scalar_of(amax), ref_amax, ref_amax * (gamma(k + 3) * 4 + kUBf16));
}

TEST(Fp8Gemm, OnGridInputsHaveOnlyTheAccumulationError) {
  for (const DType out : {DType::f32, DType::bf16}) {
    for (const bool with_bias : {false, true}) {
      expect_on_grid_gemm(DType::f8e4m3, DType::f8e4m3, out, with_bias, Fp8Compute::automatic, kCPU);
    }
  }
  expect_on_grid_gemm(DType::f8e5m2, DType::f8e4m3, DType::f32, true, Fp8Compute::emulate, kCPU);
  expect_on_grid_gemm(DType::f8e4m3, DType::f8e5m2, DType::bf16, false, Fp8Compute::emulate, kCPU);
}

// The three GEMMs of a linear layer y = x W^T, each in the K-major form fp8_gemm takes, from casts
// made on `device` (E4M3 for x and W, E5M2 for the gradient dy):
//   forward  y  [M, N] = x [M, K] . W [N, K]^T
//   dgrad    dx [M, K] = dy [M, N] . (W^T [K, N])^T      W cast transposed
//   wgrad    dW [N, K] = dy^T [N, M] . (x^T [K, M])^T    dy and x cast transposed
void expect_linear_gemms_within_bound(Device device, Fp8Compute compute) {
  const int64_t m = 64, k = 96, n = 48;
  Generator gen(11);
  const Tensor x = randn({m, k}, DType::f32, &gen), w = randn({n, k}, DType::f32, &gen) * 0.02;
  const Tensor dy = randn({m, n}, DType::f32, &gen) * 1e-4;
  const bool native = compute != Fp8Compute::emulate && fp8_native_available(device);
  const auto gemm = [&](const Cast& a, const Cast& b) {
    return fp8_gemm(a.q, b.q, a.s.scale_inv, b.s.scale_inv, DType::f32, Tensor(), nullptr, compute);
  };
  const std::string on = " on " + device.str();
  const Cast cx = cast(x, DType::f8e4m3, device), cw = cast(w, DType::f8e4m3, device);
  expect_within_rounding_bound(x, w, cx, cw, gemm(cx, cw), native, "forward" + on);
  const Cast cdy = cast(dy, DType::f8e5m2, device), cwt = cast(w, DType::f8e4m3, device, Fp8Layout::transposed);
  expect_within_rounding_bound(dy, raw::contiguous(w.transpose(0, 1)), cdy, cwt, gemm(cdy, cwt), native, "dgrad" + on);
  const Cast cdyt = cast(dy, DType::f8e5m2, device, Fp8Layout::transposed);
  const Cast cxt = cast(x, DType::f8e4m3, device, Fp8Layout::transposed);
  expect_within_rounding_bound(raw::contiguous(dy.transpose(0, 1)), raw::contiguous(x.transpose(0, 1)), cdyt, cxt,
                               gemm(cdyt, cxt), native, "wgrad" + on);
  // The casts of x with E4M3 alone, K = 256: a longer sum, the same bound.
  const Tensor x2 = randn({48, 256}, DType::f32, &gen), w2 = randn({64, 256}, DType::f32, &gen);
  const Cast cx2 = cast(x2, DType::f8e4m3, device), cw2 = cast(w2, DType::f8e4m3, device);
  expect_within_rounding_bound(x2, w2, cx2, cw2, gemm(cx2, cw2), native, "K = 256" + on);
}

TEST(Fp8Gemm, LinearLayerGemmsStayWithinTheFormatsRoundingBound) {
  expect_linear_gemms_within_bound(kCPU, Fp8Compute::automatic);
}

TEST(Fp8Gemm, ErrorsNameTheProblem) {
  const Tensor one = f32_scalar(1.0f);
  const Tensor a = on_grid({32, 64}, DType::f8e4m3, 1), b = on_grid({16, 64}, DType::f8e4m3, 2);
  const Tensor g = on_grid({32, 64}, DType::f8e5m2, 3), h = on_grid({16, 64}, DType::f8e5m2, 4);
  const auto gemm = [&](const Tensor& x, const Tensor& y) { return fp8_gemm(x, y, one, one, DType::bf16); };
  expect_contains(error_of([&] {
                    gemm(on_grid({17, 64}, DType::f8e4m3, 5), b);
                  }),
                  {"fp8_gemm", "multiples of 16", "M = 17", "[17, 64]", "[16, 64]"});
  expect_contains(error_of([&] {
                    gemm(on_grid({32, 24}, DType::f8e4m3, 5), on_grid({16, 24}, DType::f8e4m3, 6));
                  }),
                  {"multiples of 16", "K = 24"});
  expect_contains(error_of([&] {
                    gemm(a, on_grid({64, 32}, DType::f8e4m3, 6));
                  }),
                  {"fp8_gemm", "[M, K]", "[N, K]", "[32, 64]", "[64, 32]"});
  expect_contains(error_of([&] { gemm(g, h); }), {"fp8_gemm", "f8e5m2 x f8e5m2", "cuBLASLt"});
  expect_contains(error_of([&] { gemm(zeros({32, 64}), b); }), {"fp8_gemm", "f8e4m3 or f8e5m2", "f32[32, 64]"});
  expect_contains(error_of([&] { fp8_gemm(a, b, zeros({1}, DType::bf16), one, DType::f32); }),
                  {"scale_inv_a", "f32", "bf16[1]"});
  expect_contains(error_of([&] { fp8_gemm(a, b, one, zeros({2}), DType::f32); }), {"scale_inv_b", "f32[2]"});
  expect_contains(error_of([&] { fp8_gemm(a, b, one, one, DType::f16); }), {"output dtype", "bf16 or f32", "f16"});
  expect_contains(error_of([&] { fp8_gemm(a, b, one, one, DType::f32, zeros({16})); }), {"bias", "bf16", "f32[16]"});
  expect_contains(error_of([&] { fp8_gemm(a, b, one, one, DType::f32, zeros({32}, DType::bf16)); }),
                  {"bias", "[N] = [16]", "bf16[32]"});
  // The mixed formats of the two backward GEMMs are fine.
  EXPECT_EQ(gemm(g, b).shape(), (Shape{32, 16}));
  EXPECT_EQ(gemm(a, h).shape(), (Shape{32, 16}));
}

TEST(Fp8Gemm, NativeComputeWithoutAnFp8GpuIsAClearError) {
  EXPECT_FALSE(fp8_native_available(kCPU));
  const Tensor one = f32_scalar(1.0f);
  const Tensor a = on_grid({16, 16}, DType::f8e4m3, 1);
  expect_contains(error_of([&] { fp8_gemm(a, a, one, one, DType::f32, Tensor(), nullptr, Fp8Compute::native); }),
                  {"fp8_gemm", "native FP8", "compute capability 8.9", "cpu", "Fp8Compute::emulate"});
}

// ---- CUDA ----

// Every cast on CUDA against the CPU, bit for bit: the data and the amax's bits.
void expect_cuda_cast_matches_cpu(const Tensor& x_cpu, const Tensor& x_gpu, float scale, DType format, Fp8Layout layout,
                                  const std::string& what) {
  const Fp8Quantized c = quantize_fp8(x_cpu, f32_scalar(scale), format, layout);
  const Fp8Quantized g = quantize_fp8(x_gpu, f32_scalar(scale, gpu()), format, layout);
  ASSERT_EQ(g.data.device(), gpu());
  ASSERT_EQ(g.data.shape(), c.data.shape()) << what;
  const std::vector<uint8_t> cb = bytes_of(c.data), gb = bytes_of(g.data);
  const std::vector<float> xs = raw::contiguous(x_cpu).to(DType::f32).to_vector<float>();
  for (size_t i = 0; i < cb.size(); ++i) {
    // The input's bits when the layouts agree (the transposed case names the output index only).
    const uint32_t x_bits = layout == Fp8Layout::as_is ? bits_of(xs[i]) : 0u;
    ASSERT_EQ(static_cast<int>(gb[i]), static_cast<int>(cb[i]))
        << what << " " << dtype_name(format) << " scale " << scale << " at output " << i << " x bits 0x" << std::hex
        << x_bits;
  }
  EXPECT_EQ(amax_bits(g.amax), amax_bits(c.amax)) << what;
  if (layout == Fp8Layout::both) EXPECT_EQ(bytes_of(g.data_t), bytes_of(c.data_t)) << what << " transposed copy";
}

// Each code's value, its neighbours one f32 ulp away, the midpoints between consecutive codes and
// their neighbours, the specials, and random bit patterns (NaN payloads, f32 subnormals included).
std::vector<float> conversion_sweep(DType format) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 128; ++c) codes.push_back(static_cast<uint8_t>(c));
  const std::vector<float> values = raw::to(fp8_tensor(codes, {128}, format), DType::f32).to_vector<float>();
  std::vector<float> sweep = {0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN, FLT_MAX, -FLT_MAX, 1e-40f, -1e-40f};
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    const float next = i + 1 < values.size() && std::isfinite(values[i + 1]) ? values[i + 1] : 2 * values[i] + 1;
    const float mid = (values[i] + next) / 2;
    for (const float v : {values[i], mid}) {
      for (const float w : {v, std::nextafter(v, kInf), std::nextafter(v, -kInf)}) {
        sweep.push_back(w);
        sweep.push_back(-w);
      }
    }
  }
  uint32_t state = 12345;
  for (int i = 0; i < 4096; ++i) {
    state = state * 1664525u + 1013904223u;
    sweep.push_back(float_of(state));
  }
  return sweep;
}

TEST(Fp8QuantizeCuda, MatchesHandComputedTables) {
  MT_SKIP_WITHOUT_CUDA();
  expect_tables(gpu());
  expect_amax(gpu());
  expect_dequantize(gpu());
}

TEST(Fp8QuantizeCuda, ConversionMatchesTheCpuBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  for (const DType format : {DType::f8e4m3, DType::f8e5m2}) {
    const std::vector<float> sweep = conversion_sweep(format);
    const Tensor x = f32_tensor(sweep, {static_cast<int64_t>(sweep.size())});
    for (const float scale : {1.0f, 3.7f, 1.0f / 1024}) {
      expect_cuda_cast_matches_cpu(x, x.to(gpu()), scale, format, Fp8Layout::as_is, "sweep");
      // The sweep again, unaligned (the element-by-element kernel).
      const Tensor shifted = x.narrow(0, 1, x.numel() - 1);
      expect_cuda_cast_matches_cpu(shifted, x.to(gpu()).narrow(0, 1, x.numel() - 1), scale, format, Fp8Layout::as_is,
                                   "unaligned sweep");
    }
  }
}

TEST(Fp8QuantizeCuda, PlainTransposedAndBothCastsMatchTheCpuBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  const std::vector<Shape> shapes = {{1, 1}, {3, 5}, {64, 64}, {67, 131}, {128, 256}, {130, 72}, {257, 33}, {16, 1000}};
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const Shape& shape : shapes) {
      Generator gen(static_cast<uint64_t>(shape[0] * 7 + shape[1]));
      const Tensor x = (randn(shape, DType::f32, &gen) * 100.0).to(dtype);
      for (const DType format : {DType::f8e4m3, DType::f8e5m2}) {
        for (const Fp8Layout layout : {Fp8Layout::as_is, Fp8Layout::transposed, Fp8Layout::both}) {
          expect_cuda_cast_matches_cpu(x, x.to(gpu()), 2.5f, format, layout,
                                       std::string(dtype_name(dtype)) + shape_str(shape));
        }
      }
      expect_transpose_consistent(gpu(), dtype, shape[0], shape[1], DType::f8e4m3);
    }
  }
  // A row slice at an odd offset: misaligned rows, so the transposing kernel loads element by element.
  Generator gen(9);
  const Tensor big = randn({70, 37}, DType::f32, &gen).to(DType::bf16);
  expect_cuda_cast_matches_cpu(big.slice(0, 1, 70), big.to(gpu()).slice(0, 1, 70), 1.0f, DType::f8e4m3,
                               Fp8Layout::transposed, "row slice");
  // A non-contiguous view is cast as its logical elements.
  expect_cuda_cast_matches_cpu(big.transpose(0, 1), big.to(gpu()).transpose(0, 1), 1.0f, DType::f8e4m3,
                               Fp8Layout::transposed, "transposed view");
  // fp8_amax over a large tensor: many blocks meet in one atomicMax.
  const Tensor large = randn({1 << 20}, DType::f32, &gen);
  EXPECT_EQ(amax_bits(fp8_amax(large.to(gpu()))), amax_bits(fp8_amax(large)));
}

TEST(Fp8ScalingCuda, MatchesTheHandComputedSequencesAndTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  expect_delayed_scaling(gpu());
  expect_current_scale(gpu());
  // A history longer than the kernel's block: the in-place roll crosses chunks of 256.
  DelayedScaling recipe;
  recipe.history_len = 1000;
  Fp8TensorState c(recipe, kCPU), g(recipe, gpu());
  Generator gen(21);
  const std::vector<float> amaxes = rand({1100}, DType::f32, &gen).to_vector<float>();
  for (size_t i = 0; i < amaxes.size(); ++i) {
    c.update(f32_scalar(amaxes[i] * static_cast<float>(i % 97 + 1)));
    g.update(f32_scalar(amaxes[i] * static_cast<float>(i % 97 + 1), gpu()));
    if (i % 100 != 99 && i + 1 != amaxes.size()) continue;
    ASSERT_EQ(g.amax_history.to(kCPU).to_vector<float>(), c.amax_history.to_vector<float>()) << "update " << i;
    ASSERT_EQ(g.scale.to(kCPU).to_vector<float>(), c.scale.to_vector<float>()) << "update " << i;
    ASSERT_EQ(g.scale_inv.to(kCPU).to_vector<float>(), c.scale_inv.to_vector<float>()) << "update " << i;
  }
  // A checkpointed GPU state restores into a CPU one and the reverse.
  Fp8TensorState back(recipe, kCPU);
  back.load_state_dict(g.state_dict());
  EXPECT_EQ(back.amax_history.to_vector<float>(), c.amax_history.to_vector<float>());
}

// The emulated GEMM on CUDA (cuBLASLt's f32 GEMM) against the CPU's: the same f32 values up to the
// order of the additions, so within twice the on-grid bound.
TEST(Fp8GemmCuda, EmulationMatchesTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  for (const DType out : {DType::f32, DType::bf16}) {
    expect_on_grid_gemm(DType::f8e4m3, DType::f8e4m3, out, true, Fp8Compute::emulate, gpu());
  }
  expect_on_grid_gemm(DType::f8e5m2, DType::f8e4m3, DType::f32, false, Fp8Compute::emulate, gpu());
  expect_linear_gemms_within_bound(gpu(), Fp8Compute::emulate);
}

// The native GEMM against the emulation on the same operands. The tensor cores add in their own
// order and internal width (partial sums promoted to f32 as they go), so the bound allows 2^-8 of
// s * sum_k |a b| per element (a transposed operand, a lost scale or a wrong format would be off
// by the whole product) and a relative Frobenius difference of 2^-9 (f32) or 2^-7 (bf16: each
// side rounds on its own).
void expect_native_matches_emulation(DType fa, DType fb, DType out, bool with_bias, int64_t m, int64_t n, int64_t k) {
  const Tensor a = on_grid({m, k}, fa, 31), b = on_grid({n, k}, fb, 32);
  const Tensor sa = f32_scalar(0.37f, gpu()), sb = f32_scalar(3.1f, gpu());
  Generator gen(33);
  const Tensor bias = with_bias ? randn({n}, DType::f32, &gen).to(DType::bf16).to(gpu()) : Tensor();
  Tensor native_amax, emulated_amax;
  const Tensor native = fp8_gemm(a.to(gpu()), b.to(gpu()), sa, sb, out, bias, &native_amax, Fp8Compute::native);
  const Tensor emulated = fp8_gemm(a.to(gpu()), b.to(gpu()), sa, sb, out, bias, &emulated_amax, Fp8Compute::emulate);
  const std::string what = std::string(dtype_name(fa)) + " x " + dtype_name(fb) + " -> " + dtype_name(out) +
                           (with_bias ? " + bias" : "") + " [" + std::to_string(m) + ", " + std::to_string(n) + ", " +
                           std::to_string(k) + "]";
  ASSERT_EQ(native.dtype(), out) << what;
  const std::vector<double> av = values_of(a), bv = values_of(b), got = values_of(native), want = values_of(emulated);
  const double s = 0.37 * 3.1;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double mag = 0;
      for (int64_t l = 0; l < k; ++l) mag += std::abs(av[i * k + l] * bv[j * k + l]);
      const double diff = std::abs(got[i * n + j] - want[i * n + j]);
      double bound = std::ldexp(1.0, -8) * s * mag;
      if (out == DType::bf16) bound += kUBf16 * (std::abs(got[i * n + j]) + std::abs(want[i * n + j]));
      ASSERT_LE(diff, bound) << what << " at (" << i << ", " << j << ")";
    }
  }
  EXPECT_LE(relative_l2(got, want), out == DType::f32 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -7)) << what;
  const double na = scalar_of(native_amax), ea = scalar_of(emulated_amax);
  EXPECT_NEAR(na, ea, std::ldexp(1.0, -7) * ea) << what;
}

TEST(Fp8GemmCuda, NativeMatchesTheEmulation) {
  MT_SKIP_WITHOUT_CUDA();
  if (!fp8_native_available(gpu())) {
    const Tensor a = on_grid({16, 16}, DType::f8e4m3, 1).to(gpu()), one = f32_scalar(1.0f, gpu());
    expect_contains(error_of([&] { fp8_gemm(a, a, one, one, DType::f32, Tensor(), nullptr, Fp8Compute::native); }),
                    {"native FP8", "compute capability"});
    GTEST_SKIP() << "this GPU has no FP8 tensor cores (compute capability below 8.9)";
  }
  for (const DType out : {DType::bf16, DType::f32}) {
    for (const bool with_bias : {false, true}) {
      expect_native_matches_emulation(DType::f8e4m3, DType::f8e4m3, out, with_bias, 64, 48, 128);
    }
  }
  expect_native_matches_emulation(DType::f8e5m2, DType::f8e4m3, DType::bf16, false, 48, 32, 256);  // dgrad
  expect_native_matches_emulation(DType::f8e4m3, DType::f8e5m2, DType::f32, true, 32, 64, 96);     // wgrad
  expect_native_matches_emulation(DType::f8e4m3, DType::f8e4m3, DType::bf16, true, 256, 512, 1024);
  // automatic takes the native path here: the same bits as asking for it.
  const Tensor a = on_grid({32, 64}, DType::f8e4m3, 41).to(gpu()), b = on_grid({16, 64}, DType::f8e4m3, 42).to(gpu());
  const Tensor one = f32_scalar(1.0f, gpu());
  EXPECT_EQ(values_of(fp8_gemm(a, b, one, one, DType::bf16)),
            values_of(fp8_gemm(a, b, one, one, DType::bf16, Tensor(), nullptr, Fp8Compute::native)));
}

// A linear layer's three GEMMs end to end on the GPU against f64: current scales and casts (the
// transposed ones included) on the device, then the GEMMs natively where the GPU has FP8 (the
// emulation elsewhere), each within its derived bound.
TEST(Fp8GemmCuda, LinearLayerGemmsStayWithinTheFormatsRoundingBound) {
  MT_SKIP_WITHOUT_CUDA();
  expect_linear_gemms_within_bound(gpu(), Fp8Compute::automatic);
}

}  // namespace
}  // namespace mt::testing
