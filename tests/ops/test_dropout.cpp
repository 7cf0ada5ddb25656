// The dropout family (ops/dropout): op-contract cases (each with a Generator made inside the
// op's function, so every call draws the same mask), plus behaviour the contract does not cover:
// the kept fraction and scale, replay from a seed and offset, the mask against Philox, eval mode,
// p = 0 and p = 1, and CPU and CUDA masks being equal.
#include "ops/dropout/dropout.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// ---- dropout: a Generator made inside fn, so every call draws the same mask ----
MT_OP_CASE(OpCase("dropout", "dropout_p03").inputs({{4, 5}}).compute([](const In& x) {
  Generator gen(42);
  return dropout(x[0], 0.3, /*training=*/true, &gen);
}));
MT_OP_CASE(OpCase("dropout", "dropout_strided_input").inputs({{3, 6}}).compute([](const In& x) {
  Generator gen(7);
  return dropout(x[0].transpose(0, 1), 0.5, /*training=*/true, &gen);
}));

// ---- dropout behaviour ----

TEST(Dropout, FractionKeptIsOneMinusPAndKeptValuesAreScaled) {
  const int64_t n = 1000000;
  const double p = 0.3;
  Generator gen(2024);
  const std::vector<double> out = dropout(ones({n}), p, /*training=*/true, &gen).to_vector<double>();
  int64_t kept = 0;
  for (double v : out) {
    if (v != 0.0) {
      ++kept;
      ASSERT_NEAR(v, 1.0 / (1.0 - p), 1e-6);
    }
  }
  // The kept count is Binomial(n, 1 - p): standard deviation sqrt(n p (1 - p)) = 458.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 3e-3);
  EXPECT_EQ(gen.offset(), static_cast<uint64_t>(n / 4));
}

TEST(Dropout, ReplayWithTheSameSeedAndOffsetGivesTheSameOutput) {
  Generator gen(11);
  const Tensor x = randn({7, 5}, DType::f32, &gen);
  gen.set_offset(100);
  const std::vector<double> first = dropout(x, 0.5, true, &gen).to_vector<double>();
  EXPECT_EQ(gen.offset(), 100u + 9u);  // ceil(35 / 4) counters
  const std::vector<double> next = dropout(x, 0.5, true, &gen).to_vector<double>();
  EXPECT_NE(first, next);  // the offset moved on: a fresh mask
  gen.set_offset(100);
  EXPECT_EQ(dropout(x, 0.5, true, &gen).to_vector<double>(), first);
  Generator same(11);
  same.set_offset(100);
  EXPECT_EQ(dropout(x, 0.5, true, &same).to_vector<double>(), first);
}

TEST(Dropout, BackwardRecomputesTheForwardMask) {
  Generator gen(5);
  Tensor x = ones({1001}, DType::f64).requires_grad_();  // not a multiple of 4: the tail counter
  const Tensor out = dropout(x, 0.25, true, &gen);
  sum(out).backward();
  // d out / d x = out / x = out: the mask times 1 / (1 - p), element for element.
  EXPECT_EQ(x.grad().to_vector<double>(), out.to_vector<double>());
  const std::vector<double> v = out.to_vector<double>();
  EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](double e) { return e == 0.0; }));
}

// Strided inputs: [6, 4] (a transposed [4, 6]) and [20001, 7] (140007 elements, split across CPU
// tasks, the last group of four short).
TEST(Dropout, MaskMatchesPhiloxUniformAtEachLogicalIndex) {
  for (const int64_t cols : {int64_t{6}, int64_t{20001}}) {
    Generator gen(123);
    gen.set_offset(17);
    const double p = 0.4;
    const Tensor x = arange(1.0, 4.0 * static_cast<double>(cols) + 1.0, 1.0, DType::f64).reshape({4, cols});
    const Tensor strided = (cols == 6 ? x : cat({x, x.narrow(0, 0, 3)}, 0)).transpose(0, 1);
    const std::vector<double> out = dropout(strided, p, true, &gen).to_vector<double>();
    const std::vector<double> xs = strided.contiguous().to_vector<double>();
    ASSERT_EQ(out.size(), xs.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const bool keep = philox::uniform_at(123, 17, i) >= p;
      ASSERT_EQ(out[i], keep ? xs[i] * (1.0 / (1.0 - p)) : 0.0) << cols << " columns, element " << i;
    }
  }
}

TEST(Dropout, EvalModeAndZeroPReturnTheInputAndDrawNothing) {
  Tensor x = ones({8}).requires_grad_();
  Generator gen(1);
  EXPECT_EQ(dropout(x, 0.5, /*training=*/false, &gen).impl(), x.impl());
  EXPECT_EQ(dropout(x, 0.0, /*training=*/true, &gen).impl(), x.impl());
  EXPECT_EQ(gen.offset(), 0u);
}

TEST(Dropout, POneGivesZerosAndAZeroGradient) {
  Tensor x = ones({6}, DType::f64).requires_grad_();
  const Tensor out = dropout(x, 1.0, true);
  EXPECT_EQ(out.to_vector<double>(), std::vector<double>(6, 0.0));
  sum(out).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(6, 0.0));
}

TEST(Dropout, RejectsPOutsideTheUnitInterval) {
  EXPECT_CONTAINS(error_of([] { dropout(ones({2}), -0.1, true); }), "dropout");
  EXPECT_CONTAINS(error_of([] { dropout(ones({2}), 1.5, true); }), "1.5");
  EXPECT_FALSE(error_of([] { dropout(ones({2}), std::nan(""), true); }).empty());
}

TEST(Dropout, DefaultGeneratorAdvances) {
  Generator& gen = default_generator(kCPU);
  const uint64_t before = gen.offset();
  dropout(ones({10}), 0.5, true);
  EXPECT_EQ(gen.offset(), before + 3);
}

TEST(Dropout, CpuAndCudaMasksAreEqual) {
  MT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    Generator a(99), b(99);
    a.set_offset(5);
    b.set_offset(5);
    const Tensor x = ones({1001, 3}, dtype);  // odd size: a partial last counter
    const std::vector<double> cpu = dropout(x, 0.3, true, &a).to_vector<double>();
    const std::vector<double> cuda = dropout(x.to(gpu()), 0.3, true, &b).to_vector<double>();
    EXPECT_EQ(cpu, cuda) << dtype_name(dtype);
    EXPECT_EQ(a.offset(), b.offset());
  }
}

}  // namespace
}  // namespace mt::testing
