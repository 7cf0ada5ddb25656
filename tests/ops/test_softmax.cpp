// The softmax family (ops/softmax): op-contract cases for softmax and log_softmax, plus
// behaviour the contract does not cover: stability for large inputs, the two ops against each
// other, other dims, the 0-d case and the errors. Large CUDA shapes: test_softmax_loss_norm_large.cpp.
#include <cmath>

#include "ops/ops.h"
#include "ops/softmax/softmax.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// ---- softmax ----
MT_OP_CASE(OpCase("softmax", "softmax_last_dim").inputs({{3, 5}}).compute([](const In& x) { return softmax(x[0]); }));
MT_OP_CASE(OpCase("softmax", "softmax_dim0").inputs({{4, 3}}).compute([](const In& x) { return softmax(x[0], 0); }));
MT_OP_CASE(OpCase("softmax", "softmax_middle_dim_3d").inputs({{2, 3, 4}}).compute([](const In& x) {
  return softmax(x[0], 1);
}));
MT_OP_CASE(OpCase("log_softmax", "log_softmax_last_dim").inputs({{3, 5}}).compute([](const In& x) {
  return log_softmax(x[0], -1);
}));
MT_OP_CASE(OpCase("log_softmax", "log_softmax_dim0_3d").inputs({{3, 2, 2}}).compute([](const In& x) {
  return log_softmax(x[0], 0);
}));

// ---- softmax ----

TEST(Softmax, RowsSumToOneAndLargeInputsStayFinite) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    // exp(1000) overflows every floating type: only the max-subtracted form survives.
    const Tensor x = from_vector({1000, 1001, 1002, 999, -5, 0, 5, 1}, {2, 4}, dtype);
    const std::vector<double> xv = x.to_vector<double>();  // as rounded to dtype (bf16 keeps 1000 and 1000)
    const std::vector<double> y = softmax(x).to_vector<double>();
    const std::vector<double> z = log_softmax(x).to_vector<double>();
    const double tol = dtype == DType::f64 ? 1e-12 : dtype == DType::f32 ? 1e-6 : 1e-2;
    for (int r = 0; r < 2; ++r) {
      double s = 0, denom = 0;
      for (int c = 0; c < 4; ++c) denom += std::exp(xv[r * 4 + c] - xv[r * 4 + 2]);  // x[r, 2] is the row max
      for (int c = 0; c < 4; ++c) {
        const double want_log = (xv[r * 4 + c] - xv[r * 4 + 2]) - std::log(denom);
        EXPECT_NEAR(y[r * 4 + c], std::exp(want_log), tol) << dtype_name(dtype) << " " << r << "," << c;
        EXPECT_NEAR(z[r * 4 + c], want_log, 4 * tol) << dtype_name(dtype) << " " << r << "," << c;
        s += y[r * 4 + c];
      }
      EXPECT_NEAR(s, 1.0, 4 * tol) << dtype_name(dtype) << " row " << r;
    }
    EXPECT_EQ(softmax(x).dtype(), dtype);
  }
}

TEST(Softmax, LogSoftmaxEqualsLogOfSoftmaxInF64) {
  Generator gen(7);
  const Tensor x = randn({4, 7}, DType::f64, &gen) * 3.0;
  for (int64_t dim : {0, 1, -1}) {
    const std::vector<double> a = log_softmax(x, dim).to_vector<double>();
    const std::vector<double> b = log(softmax(x, dim)).to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12) << "dim " << dim << " element " << i;
  }
}

TEST(Softmax, OtherDimMatchesTransposeAndIsContiguous) {
  Generator gen(8);
  const Tensor x = randn({3, 5}, DType::f64, &gen);
  const Tensor a = softmax(x, 0);
  const Tensor b = softmax(x.transpose(0, 1), 1).transpose(0, 1);
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.shape(), x.shape());
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  for (size_t i = 0; i < av.size(); ++i) EXPECT_NEAR(av[i], bv[i], 1e-15);
}

TEST(Softmax, ZeroDimTensorIsOne) {
  Tensor x = full({}, 3.0, DType::f64).requires_grad_();
  const Tensor y = softmax(x);
  EXPECT_EQ(y.shape(), Shape{});
  EXPECT_EQ(y.item(), 1.0);
  EXPECT_EQ(log_softmax(x).item(), 0.0);
  y.backward();
  EXPECT_EQ(x.grad().item(), 0.0);
}

TEST(Softmax, RejectsIntegerInputAndBadDim) {
  expect_contains(error_of([] { softmax(ones({2, 3}, DType::i64)); }), {"softmax", "i64"});
  expect_contains(error_of([] { log_softmax(ones({2, 3}), 2); }), {"log_softmax", "2"});
}

}  // namespace
}  // namespace mt::testing
