// The where family (ops/where): op-contract cases for where and masked_fill, plus behaviour the
// contract does not cover: dtype promotion, gradients summed over broadcast, strided operands,
// the condition's and mask's checks, and CUDA against the CPU.
#include <limits>

#include "core/view.h"
#include "ops/ops.h"
#include "ops/where/where.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// ---- where / masked_fill ----
MT_OP_CASE(OpCase("where", "where_broadcast_b")
               .inputs({{2, 3}, {3}})
               .extra([] {
                 return In{from_vector({1, 0, 1, 0, 0, 1}, {2, 3}, DType::boolean)};
               })
               .compute([](const In& x) { return where(x[2], x[0], x[1]); }));
MT_OP_CASE(OpCase("where", "where_broadcast_all")
               .inputs({{2, 1}, {1, 3}})
               .extra([] {
                 return In{from_vector({0, 1, 1}, {3}, DType::u8)};
               })
               .compute([](const In& x) { return where(x[2], x[0], x[1]); }));
MT_OP_CASE(OpCase("masked_fill", "masked_fill_broadcast_mask")
               .inputs({{2, 3}})
               .extra([] {
                 return In{from_vector({1, 0, 1}, {3}, DType::u8)};
               })
               .compute([](const In& x) { return masked_fill(x[0], x[1], -1.5); }));
MT_OP_CASE(OpCase("masked_fill", "masked_fill_bool_mask")
               .inputs({{2, 2, 2}})
               .extra([] {
                 return In{from_vector({0, 1, 1, 0, 0, 0, 1, 1}, {2, 2, 2}, DType::boolean)};
               })
               .compute([](const In& x) { return masked_fill(x[0], x[1], 4.0); }));

// ---- where / masked_fill behaviour ----

TEST(Where, SelectsAndPromotes) {
  const Tensor c = from_vector({1, 0, 1}, {3}, DType::boolean);
  const Tensor out = where(c, from_vector({1, 2, 3}, {3}, DType::f16), from_vector({-1}, {1}, DType::f32));
  EXPECT_EQ(out.dtype(), DType::f32);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1, -1, 3}));
}

TEST(Where, GradientsGoToTheSelectedSideSummedOverBroadcast) {
  Tensor a = from_vector({1, 2}, {2, 1}, DType::f64).requires_grad_();
  Tensor b = from_vector({5, 6, 7}, {3}, DType::f64).requires_grad_();
  const Tensor c = from_vector({1, 0, 0, 1, 1, 0}, {2, 3}, DType::u8);
  sum(where(c, a, b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0, 1, 2}));
}

TEST(Where, RejectsFloatConditionAndBadShapes) {
  EXPECT_THROW(where(ones({2}), ones({2}), ones({2})), DTypeError);
  const std::string msg = error_of([] { where(ones({2}, DType::boolean), ones({3}), ones({3})); });
  EXPECT_CONTAINS(msg, "where");
  EXPECT_CONTAINS(msg, "[2]");
  EXPECT_CONTAINS(msg, "[3]");
}

TEST(MaskedFill, FillsNegativeInfinityAndBlocksTheGradient) {
  Tensor x = from_vector({1, 2, 3, 4}, {2, 2}, DType::f32).requires_grad_();
  const Tensor mask = from_vector({0, 1}, {2}, DType::boolean);
  const Tensor out = masked_fill(x, mask, -std::numeric_limits<double>::infinity());
  const std::vector<double> v = out.to_vector<double>();
  EXPECT_EQ(v[0], 1.0);
  EXPECT_TRUE(std::isinf(v[1]) && v[1] < 0);
  EXPECT_EQ(v[2], 3.0);
  sum(masked_fill(x, mask, 0.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 0, 1, 0}));
}

TEST(MaskedFill, MaskMustBroadcastToTheInput) {
  const std::string msg = error_of([] { masked_fill(ones({3}), ones({2, 3}, DType::boolean), 0.0); });
  EXPECT_CONTAINS(msg, "masked_fill");
  EXPECT_CONTAINS(msg, "[2, 3]");
  EXPECT_THROW(masked_fill(ones({3}), ones({3}, DType::f32), 0.0), DTypeError);
}

// Transposed and broadcast operands over more elements than one CPU task takes (the loop
// splits across threads): every element is the selected operand's, by index.
TEST(Where, StridedAndBroadcastOperandsSelectElementByElement) {
  Generator gen(9);
  const int64_t n0 = 33, n1 = 40, n2 = 70;
  const Tensor a_t = randn({n2, n0}, DType::f32, &gen);  // a = a_t^T, seen as [n0, 1, n2]
  const Tensor a = a_t.transpose(0, 1).unsqueeze(1);
  const Tensor b = randn({1, n1, n2}, DType::f32, &gen);
  std::vector<double> cv(static_cast<size_t>(n1 * n2));
  for (size_t i = 0; i < cv.size(); ++i) cv[i] = (i * 7) % 3 == 0;
  const Tensor c = from_vector(cv, {n1, n2}, DType::u8);
  const std::vector<double> out = where(c, a, b).to_vector<double>();
  const std::vector<double> av = a_t.to_vector<double>(), bv = b.to_vector<double>();
  ASSERT_EQ(out.size(), static_cast<size_t>(n0 * n1 * n2));
  for (int64_t i = 0; i < n0; ++i) {
    for (int64_t j = 0; j < n1; ++j) {
      for (int64_t k = 0; k < n2; ++k) {
        const double want = cv[j * n2 + k] != 0 ? av[k * n0 + i] : bv[j * n2 + k];
        ASSERT_EQ(out[(i * n1 + j) * n2 + k], want) << i << ", " << j << ", " << k;
      }
    }
  }
}

TEST(Where, CudaMatchesCpuForLargeBroadcast) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(8);
  const Tensor a = randn({33, 1, 70}, DType::f32, &gen), b = randn({1, 40, 70}, DType::f32, &gen);
  std::vector<double> cv(40 * 70);
  for (size_t i = 0; i < cv.size(); ++i) cv[i] = (i * 7) % 3 == 0;
  const Tensor c = from_vector(cv, {40, 70}, DType::boolean);
  EXPECT_EQ(where(c.to(gpu()), a.to(gpu()), b.to(gpu())).to_vector<double>(), where(c, a, b).to_vector<double>());
}

}  // namespace
}  // namespace mt::testing
