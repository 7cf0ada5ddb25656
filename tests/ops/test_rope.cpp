// RoPE (ops/rope): op-contract cases on contiguous heads, on the heads view of a projection and
// far from position 0; values against the rotate_half formula in f64; a start offset equals the
// matching rows of a longer sequence; the backward is the inverse rotation; errors.
#include <cmath>

#include "core/view.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// 1 / 10000^(2i / D), f32, on `device`.
Tensor inv_freq(int64_t d, Device device) {
  std::vector<double> f(static_cast<size_t>(d / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(d));
  }
  return from_vector(f, {d / 2}, TensorOptions().dtype(DType::f32).device(device));
}

MT_OP_CASE(OpCase("rope", "rope_contiguous").inputs({{2, 3, 5, 8}}).compute([](const In& x) {
  return rope(x[0], inv_freq(8, x[0].device()));
}));
// [B, T, H, D] storage seen as [B, H, T, D] (a projection's heads), D not a power of two.
MT_OP_CASE(OpCase("rope", "rope_heads_view_far_positions").inputs({{2, 7, 3, 12}}).compute([](const In& x) {
  return rope(x[0].transpose(1, 2), inv_freq(12, x[0].device()), /*start=*/4000);
}));

// Packed rows: each row's own positions (restarting where a new sequence starts).
Tensor packed_positions(Device device) {
  return from_vector({0, 1, 2, 0, 1, 5, 6, 7, 0, 1}, {2, 5}, TensorOptions().dtype(DType::i64).device(device));
}
MT_OP_CASE(OpCase("rope", "rope_packed_positions").inputs({{2, 5, 3, 12}}).compute([](const In& x) {
  return rope(x[0].transpose(1, 2), inv_freq(12, x[0].device()), packed_positions(x[0].device()));
}));

// y[i] = x[i] cos - x[i + D/2] sin, y[i + D/2] = x[i + D/2] cos + x[i] sin, angle = f32(t) * f.
std::vector<double> rope_formula(const Tensor& x, const Tensor& freq, int64_t start) {
  const int64_t rows = x.numel() / x.size(3), T = x.size(2), half = x.size(3) / 2;
  const std::vector<double> in = x.contiguous().to_vector<double>();
  const std::vector<float> f = freq.to_vector<float>();
  std::vector<double> out(in.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<float>(start + t) * f[static_cast<size_t>(i)];
      const double x1 = in[static_cast<size_t>(r * 2 * half + i)],
                   x2 = in[static_cast<size_t>(r * 2 * half + i + half)];
      out[static_cast<size_t>(r * 2 * half + i)] = x1 * std::cos(angle) - x2 * std::sin(angle);
      out[static_cast<size_t>(r * 2 * half + i + half)] = x2 * std::cos(angle) + x1 * std::sin(angle);
    }
  }
  return out;
}

void expect_matches_formula(Device device) {
  Generator gen(5);
  const Tensor x = randn({2, 4, 6, 10}, DType::f64, &gen);
  for (const int64_t start : {int64_t{0}, int64_t{37}, int64_t{30000}}) {
    const Tensor y = rope(x.to(DType::f32).to(device), inv_freq(10, device), start);
    const std::vector<double> want = rope_formula(x.to(DType::f32), inv_freq(10, kCPU), start);
    const std::vector<double> got = y.to(kCPU).to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << "start " << start << " at " << i;
  }
}

TEST(Rope, MatchesTheRotateHalfFormula) { expect_matches_formula(kCPU); }
TEST(Rope, CudaMatchesTheRotateHalfFormula) {
  MT_SKIP_WITHOUT_CUDA();
  expect_matches_formula(gpu());
}

// A cached generation step's rows: start s on rows [s, T) equals those rows of the whole sequence.
TEST(Rope, StartOffsetEqualsTheRowsOfTheLongerSequence) {
  Generator gen(6);
  const Tensor x = randn({1, 2, 9, 8}, DType::f32, &gen);
  const Tensor whole = rope(x, inv_freq(8, kCPU));
  const Tensor tail = rope(x.slice(2, 6, 9), inv_freq(8, kCPU), 6);
  EXPECT_EQ(tail.to_vector<double>(), whole.slice(2, 6, 9).contiguous().to_vector<double>());
}

// The heads view keeps its layout (attention reads it in place), and a rotation's gradient
// rotates back: d/dx sum(rope(x) * rope(x)) = 2x, as a rotation keeps norms.
TEST(Rope, KeepsTheHeadsLayoutAndItsGradientRotatesBack) {
  Generator gen(7);
  const Tensor stored = randn({2, 5, 3, 8}, DType::f64, &gen).requires_grad_();
  const Tensor y = rope(stored.transpose(1, 2), inv_freq(8, kCPU), 11);
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_TRUE(y.transpose(1, 2).is_contiguous());
  sum(mul(y, y)).backward();
  const std::vector<double> g = stored.grad().to_vector<double>(), x = stored.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 2 * x[i], 1e-12);
}

// Per-row positions rotate each row as that row alone would be at its position: rows of a packed
// sequence equal the rows of the sequence run from position 0, and positions start + t equal start.
void expect_positions_rotate_each_row(Device device) {
  Generator gen(8);
  const Tensor x = randn({2, 3, 5, 12}, DType::f32, &gen).to(device);
  const Tensor y = rope(x, inv_freq(12, device), packed_positions(device)).to(kCPU);
  const Tensor x_cpu = x.to(kCPU);
  const auto expect_rows = [&](int64_t b, int64_t first, int64_t n, int64_t start) {
    const Tensor want = rope(x_cpu.slice(0, b, b + 1).slice(2, first, first + n), inv_freq(12, kCPU), start);
    const std::vector<double> got = y.slice(0, b, b + 1).slice(2, first, first + n).contiguous().to_vector<double>();
    const std::vector<double> w = want.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], w[i], 2e-6) << "row " << b << " from " << first;
  };
  expect_rows(0, 0, 3, 0);  // row 0: a sequence at 0, 1, 2, then one at 0, 1
  expect_rows(0, 3, 2, 0);
  expect_rows(1, 0, 3, 5);  // row 1: 5, 6, 7, then 0, 1
  expect_rows(1, 3, 2, 0);
}

TEST(Rope, PositionsRotateEachRowAtItsOwnPosition) { expect_positions_rotate_each_row(kCPU); }
TEST(Rope, CudaPositionsRotateEachRowAtItsOwnPosition) {
  MT_SKIP_WITHOUT_CUDA();
  expect_positions_rotate_each_row(gpu());
}

TEST(Rope, PositionErrorsNameTheShapes) {
  const Tensor x = ones({2, 3, 5, 8});
  expect_contains(error_of([&] {
                    rope(x, inv_freq(8, kCPU), ones({2, 4}, DType::i64));
                  }),
                  {"rope", "positions", "[2, 5]", "[2, 4]"});
  expect_contains(error_of([&] {
                    rope(x, inv_freq(8, kCPU), ones({2, 5}, DType::i32));
                  }),
                  {"rope", "positions", "i64"});
}

TEST(Rope, ErrorsNameTheOpAndTheShapes) {
  expect_contains(error_of([] { rope(ones({2, 3, 5}), inv_freq(4, kCPU)); }), {"rope", "[B, H, T, D]", "[2, 3, 5]"});
  expect_contains(error_of([] { rope(ones({1, 2, 3, 7}), inv_freq(6, kCPU)); }), {"rope", "even D"});
  expect_contains(error_of([] { rope(ones({1, 2, 3, 8}), inv_freq(6, kCPU)); }), {"rope", "inv_freq", "[4]"});
  expect_contains(error_of([] { rope(ones({1, 2, 3, 8}), ones({4}, DType::f64)); }), {"rope", "inv_freq", "f32"});
  expect_contains(error_of([] { rope(ones({1, 2, 3, 8}), inv_freq(8, kCPU), -1); }), {"rope", "start"});
}

}  // namespace
}  // namespace mt::testing
