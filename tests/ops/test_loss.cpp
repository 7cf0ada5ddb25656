// The loss family (ops/loss): op-contract cases for cross_entropy and the fused
// linear_cross_entropy head, plus behaviour the contract does not cover: hand-computed values,
// large logits, ignore_index, dtypes, every chunking of the fused head, autocast, NaN and
// out-of-range targets on CUDA, and the errors. Large CUDA shapes: test_softmax_loss_norm_large.cpp.
#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "core/view.h"
#include "ops/loss/loss.h"
#include "ops/matmul/matmul.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

Tensor i64_tensor(const std::vector<double>& values, const Shape& shape) {
  return from_vector(values, shape, DType::i64);
}

// ---- cross_entropy (targets via extra(): the gradcheck perturbs only the logits) ----
MT_OP_CASE(OpCase("cross_entropy", "cross_entropy_mean")
               .inputs({{4, 5}})
               .extra([] {
                 return In{i64_tensor({1, 3, 0, 4}, {4})};
               })
               .compute([](const In& x) { return cross_entropy(x[0], x[1]); }));
MT_OP_CASE(OpCase("cross_entropy", "cross_entropy_sum")
               .inputs({{4, 5}})
               .extra([] {
                 return In{i64_tensor({2, 2, 0, 1}, {4})};
               })
               .compute([](const In& x) { return cross_entropy(x[0], x[1], -100, Reduction::sum); }));
MT_OP_CASE(OpCase("cross_entropy", "cross_entropy_mean_ignore_index")
               .inputs({{5, 4}})
               .extra([] {
                 return In{i64_tensor({1, -100, 3, -100, 0}, {5})};
               })
               .compute([](const In& x) { return cross_entropy(x[0], x[1]); }));
MT_OP_CASE(OpCase("cross_entropy", "cross_entropy_none_ignore_2")
               .inputs({{4, 3}})
               .extra([] {
                 return In{from_vector({2, 0, 1, 2}, {4}, DType::i32)};
               })
               .compute([](const In& x) { return cross_entropy(x[0], x[1], /*ignore_index=*/2, Reduction::none); }));
MT_OP_CASE(OpCase("cross_entropy", "cross_entropy_spatial_mean")
               .inputs({{2, 3, 2}})
               .extra([] {
                 return In{i64_tensor({0, 2, -100, 1}, {2, 2})};
               })
               .compute([](const In& x) { return cross_entropy(x[0], x[1]); }));

// ---- linear_cross_entropy (x and weight perturbed; chunk_rows 2 splits 5 rows into 3 chunks) ----
MT_OP_CASE(OpCase("linear_cross_entropy", "linear_cross_entropy_mean_chunked")
               .inputs({{5, 3}, {4, 3}})
               .extra([] {
                 return In{i64_tensor({1, 3, 0, -100, 2}, {5})};
               })
               .compute([](const In& x) {
                 LinearCrossEntropyOptions o;
                 o.chunk_rows = 2;
                 return linear_cross_entropy(x[0], x[1], x[2], o);
               }));
MT_OP_CASE(OpCase("linear_cross_entropy", "linear_cross_entropy_sum")
               .inputs({{4, 6}, {5, 6}})
               .extra([] {
                 return In{from_vector({4, 0, 2, 2}, {4}, DType::i32)};
               })
               .compute([](const In& x) {
                 LinearCrossEntropyOptions o;
                 o.reduction = Reduction::sum;
                 return linear_cross_entropy(x[0], x[1], x[2], o);
               }));

// ---- cross_entropy ----

TEST(CrossEntropy, MatchesHandComputation) {
  const Tensor logits = from_vector({1, 2, 3, 1, 1, 1}, {2, 3}, DType::f64);
  const Tensor target = i64_tensor({2, 0}, {2});
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  const double l1 = std::log(3.0);
  const std::vector<double> none = cross_entropy(logits, target, -100, Reduction::none).to_vector<double>();
  ASSERT_EQ(none.size(), 2u);
  EXPECT_NEAR(none[0], l0, 1e-12);
  EXPECT_NEAR(none[1], l1, 1e-12);
  EXPECT_NEAR(cross_entropy(logits, target, -100, Reduction::sum).item(), l0 + l1, 1e-12);
  EXPECT_NEAR(cross_entropy(logits, target).item(), (l0 + l1) / 2, 1e-12);
  EXPECT_EQ(cross_entropy(logits, target).shape(), Shape{});

  // d(mean)/dlogits = (softmax - onehot) / N
  Tensor x = logits.clone().requires_grad_();
  cross_entropy(x, target).backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(g[0], std::exp(1.0) / z / 2, 1e-12);
  EXPECT_NEAR(g[2], (std::exp(3.0) / z - 1) / 2, 1e-12);
  EXPECT_NEAR(g[3], (1.0 / 3 - 1) / 2, 1e-12);
  EXPECT_NEAR(g[4], (1.0 / 3) / 2, 1e-12);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  const Tensor logits = from_vector({1000, 0, -1000, 1000}, {2, 2}, DType::f32);
  const std::vector<double> l =
      cross_entropy(logits, i64_tensor({0, 0}, {2}), -100, Reduction::none).to_vector<double>();
  EXPECT_NEAR(l[0], 0.0, 1e-6);
  EXPECT_NEAR(l[1], 2000.0, 1e-3);
}

TEST(CrossEntropy, IgnoredRowsLeaveTheMeanDenominator) {
  const Tensor logits = from_vector({0.5, -1, 2, 0, 3, 1, -2, 0.25, 1, 1, 0, -1}, {3, 4}, DType::f64);
  const Tensor target = i64_tensor({1, -100, 2}, {3});
  const std::vector<double> rows = cross_entropy(logits, target, -100, Reduction::none).to_vector<double>();
  EXPECT_EQ(rows[1], 0.0);
  EXPECT_NEAR(cross_entropy(logits, target).item(), (rows[0] + rows[2]) / 2, 1e-12);  // 2 rows count, not 3
  EXPECT_NEAR(cross_entropy(logits, target, -100, Reduction::sum).item(), rows[0] + rows[2], 1e-12);

  Tensor x = logits.clone().requires_grad_();
  cross_entropy(x, target).backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(g[4 + c], 0.0) << "ignored row, class " << c;
  double row0 = 0;
  for (int c = 0; c < 4; ++c) row0 += g[c];
  EXPECT_NEAR(row0, 0.0, 1e-12);  // softmax - onehot sums to 0 over a row
  EXPECT_NEAR(g[1], (std::exp(-1.0) / (std::exp(0.5) + std::exp(-1.0) + std::exp(2.0) + 1.0) - 1) / 2, 1e-12);

  // A custom ignore_index that is a valid class.
  const Tensor t2 = i64_tensor({1, 1, 2}, {3});
  EXPECT_NEAR(cross_entropy(logits, t2, /*ignore_index=*/1).item(), rows[2], 1e-12);
}

TEST(CrossEntropy, AllRowsIgnoredGivesNanMeanAndZeroGradient) {
  Tensor x = from_vector({1, 2, 3, 4}, {2, 2}, DType::f64).requires_grad_();
  const Tensor target = i64_tensor({-100, -100}, {2});
  const Tensor loss = cross_entropy(x, target);
  EXPECT_TRUE(std::isnan(loss.item()));
  EXPECT_EQ(cross_entropy(x, target, -100, Reduction::sum).item(), 0.0);
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0}));
}

TEST(CrossEntropy, LossIsF32ForHalfLogitsAndGradientKeepsTheirDtype) {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    Tensor x = from_vector({1, 2, 3, 0.5, 0.25, 0}, {2, 3}, dtype).requires_grad_();
    const Tensor loss = cross_entropy(x, from_vector({2, 1}, {2}, DType::i32));
    EXPECT_EQ(loss.dtype(), DType::f32) << dtype_name(dtype);
    loss.backward();
    EXPECT_EQ(x.grad().dtype(), dtype);
  }
  EXPECT_EQ(cross_entropy(ones({2, 3}, DType::f64), i64_tensor({0, 1}, {2})).dtype(), DType::f64);
}

TEST(CrossEntropy, SpatialDimsMatchFlattenedRows) {
  Generator gen(9);
  const Tensor logits = randn({2, 3, 2}, DType::f64, &gen);  // [N, C, d]
  const Tensor target = i64_tensor({0, 2, 1, 1}, {2, 2});    // [N, d]
  const Tensor flat = logits.permute({0, 2, 1}).reshape({4, 3});
  const std::vector<double> a = cross_entropy(logits, target, -100, Reduction::none).to_vector<double>();
  const std::vector<double> b = cross_entropy(flat, target.reshape({4}), -100, Reduction::none).to_vector<double>();
  EXPECT_EQ(cross_entropy(logits, target, -100, Reduction::none).shape(), (Shape{2, 2}));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-14);
}

TEST(CrossEntropy, ErrorsNameTheOpShapesAndDtypes) {
  const Tensor logits = zeros({3, 4});
  try {
    cross_entropy(logits, i64_tensor({0, 1}, {2}));
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    expect_contains(e.what(), {"cross_entropy", "[3, 4]", "[2]", "[3]"});
  }
  try {
    cross_entropy(logits, zeros({3}));
    FAIL() << "expected a DTypeError";
  } catch (const DTypeError& e) {
    expect_contains(e.what(), {"cross_entropy", "f32[3]", "i64"});
  }
  expect_contains(error_of([&] {
                    cross_entropy(logits, i64_tensor({0, 7, 1}, {3}));
                  }),
                  {"cross_entropy", "7", "4 classes", "index 1"});
  expect_contains(error_of([&] { cross_entropy(logits, i64_tensor({0, -1, 1}, {3})); }), {"cross_entropy", "-1"});
  expect_contains(error_of([] { cross_entropy(zeros({4}), i64_tensor({0}, {1})); }), {"cross_entropy", "[4]"});
  expect_contains(error_of([] {
                    cross_entropy(ones({2, 3}, DType::i64), i64_tensor({0, 1}, {2}));
                  }),
                  {"cross_entropy", "i64[2, 3]"});
}

// ---- linear_cross_entropy ----

// The fused head against linear then cross_entropy, in f64: loss and both gradients,
// for every chunking (one row per chunk up to all rows at once) and both reductions.
TEST(LinearCrossEntropy, EqualsLinearThenCrossEntropyForEveryChunking) {
  Generator gen(5);
  const Tensor x0 = randn({7, 5}, DType::f64, &gen), w0 = randn({9, 5}, DType::f64, &gen);
  const Tensor target = i64_tensor({3, -100, 8, 0, 0, -100, 5}, {7});
  for (Reduction reduction : {Reduction::mean, Reduction::sum}) {
    Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
    const Tensor ref = cross_entropy(linear(xr, wr), target, -100, reduction);
    ref.backward();
    for (int64_t chunk : {1, 2, 3, 7, 0}) {
      Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      LinearCrossEntropyOptions o;
      o.reduction = reduction;
      o.chunk_rows = chunk;
      const Tensor loss = linear_cross_entropy(x, w, target, o);
      EXPECT_EQ(loss.shape(), Shape{});
      EXPECT_NEAR(loss.item(), ref.item(), 1e-12) << "chunk_rows " << chunk;
      (loss * 3.0).backward();  // an incoming gradient other than 1 reaches both inputs
      EXPECT_LE(relative_norm_error(x.grad(), xr.grad() * 3.0), 1e-13) << "dx, chunk_rows " << chunk;
      EXPECT_LE(relative_norm_error(w.grad(), wr.grad() * 3.0), 1e-13) << "dW, chunk_rows " << chunk;
      const std::vector<double> gx = x.grad().to_vector<double>();
      for (int c = 0; c < 5; ++c) EXPECT_EQ(gx[5 + c], 0.0) << "ignored row 1 has no gradient";
    }
  }
}

TEST(LinearCrossEntropy, AFrozenWeightGetsNoGradientAndNoGradModeRecordsNothing) {
  Generator gen(6);
  Tensor x = randn({4, 3}, DType::f64, &gen).requires_grad_();
  const Tensor w = randn({6, 3}, DType::f64, &gen);  // frozen: the LoRA case
  const Tensor target = i64_tensor({0, 5, 2, 2}, {4});
  linear_cross_entropy(x, w, target).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  NoGradGuard no_grad;
  EXPECT_FALSE(linear_cross_entropy(x, w, target).requires_grad());
}

// Under bf16 autocast both paths run their GEMMs in bf16; the fused one never
// rounds the logits' gradient by the 1/N of the mean (it scales afterwards), so
// the two agree to bf16 rounding, not bitwise.
TEST(LinearCrossEntropy, UnderAutocastMatchesLinearThenCrossEntropy) {
  Generator gen(7);
  const Tensor x0 = randn({64, 32}, DType::f32, &gen), w0 = randn({100, 32}, DType::f32, &gen) * 0.2;
  const Tensor target = raw::to(uniform({64}, 0, 99.999, DType::f64, &gen), DType::i64);
  Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
  Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  Tensor ref, loss;
  {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    ref = cross_entropy(linear(xr, wr), target);
    LinearCrossEntropyOptions o;
    o.chunk_rows = 24;
    loss = linear_cross_entropy(x, w, target, o);
  }
  EXPECT_EQ(loss.dtype(), DType::f32);
  EXPECT_NEAR(loss.item(), ref.item(), 1e-6 * std::abs(ref.item()));  // the same bf16 logits, the same f32 sums
  ref.backward();
  loss.backward();
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_LE(relative_norm_error(x.grad(), xr.grad()), 1e-2);
  EXPECT_LE(relative_norm_error(w.grad(), wr.grad()), 1e-2);
}

// Every row ignored: the mean is 0/0 = NaN, as cross_entropy's, and every gradient is exactly 0
// (not NaN from 0 * (1/0)), so a batch of padding cannot poison the weights.
void expect_all_ignored_gives_nan_and_zero_gradients(const Device& device) {
  Generator gen(8);
  Tensor x = randn({3, 4}, DType::f32, &gen).to(device).requires_grad_();
  Tensor w = randn({5, 4}, DType::f32, &gen).to(device).requires_grad_();
  const Tensor target = i64_tensor({-100, -100, -100}, {3}).to(device);
  const Tensor loss = linear_cross_entropy(x, w, target);
  EXPECT_TRUE(std::isnan(loss.item()));
  loss.backward();
  for (double v : x.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
  for (double v : w.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
}

TEST(LinearCrossEntropy, AllRowsIgnoredGivesNanMeanAndZeroGradients) {
  expect_all_ignored_gives_nan_and_zero_gradients(kCPU);
}

TEST(LinearCrossEntropy, CudaAllRowsIgnoredGivesNanMeanAndZeroGradients) {
  MT_SKIP_WITHOUT_CUDA();
  expect_all_ignored_gives_nan_and_zero_gradients(cuda_device(0));
}

TEST(LinearCrossEntropy, ErrorsNameTheOpAndShapes) {
  const Tensor x = ones({4, 3}), w = ones({5, 3}), t = i64_tensor({0, 1, 2, 3}, {4});
  expect_contains(error_of([&] {
                    linear_cross_entropy(x, ones({5, 2}), t);
                  }),
                  {"linear_cross_entropy", "[4, 3]", "[5, 2]"});
  expect_contains(error_of([&] {
                    linear_cross_entropy(x, w, i64_tensor({0, 1}, {2}));
                  }),
                  {"linear_cross_entropy", "target", "[2]"});
  expect_contains(error_of([&] {
                    linear_cross_entropy(x, w, i64_tensor({0, 1, 9, 3}, {4}));
                  }),
                  {"target value 9", "5 classes"});
  LinearCrossEntropyOptions none;
  none.reduction = Reduction::none;
  expect_contains(error_of([&] { linear_cross_entropy(x, w, t, none); }), {"linear_cross_entropy", "none"});
}

// A NaN logit makes the loss NaN (on CUDA through the fused head's packed softmax) rather than
// being passed over: one NaN weight element puts a NaN in every row's logits.
void expect_nan_logit_gives_nan_loss(Device device) {
  Generator gen(8);
  const Tensor x = randn({4, 16}, DType::f32, &gen);
  std::vector<double> w_values = randn({64, 16}, DType::f32, &gen).to_vector<double>();
  w_values[5 * 16 + 3] = std::numeric_limits<double>::quiet_NaN();
  const Tensor w = from_vector(w_values, {64, 16}, DType::f32);
  const Tensor target = from_vector({1, 2, 3, 4}, {4}, DType::i64);
  EXPECT_TRUE(std::isnan(linear_cross_entropy(x.to(device), w.to(device), target.to(device)).item())) << device.str();
}

TEST(LinearCrossEntropy, ANanLogitMakesTheLossNan) { expect_nan_logit_gives_nan_loss(Device("cpu")); }

TEST(SoftmaxLossNormCuda, ANanLogitMakesTheFusedHeadsLossNan) {
  MT_SKIP_WITHOUT_CUDA();
  expect_nan_logit_gives_nan_loss(cuda_device(0));
}

TEST(SoftmaxLossNormCuda, OutOfRangeTargetGivesNanRowWithoutSync) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor x = raw::to(from_vector({1, 2, 3, 4, 5, 6}, {2, 3}), cuda_device(0)).requires_grad_();
  const Tensor target = raw::to(i64_tensor({7, 1}, {2}), cuda_device(0));
  const Tensor rows = cross_entropy(x, target, -100, Reduction::none);
  const std::vector<double> l = rows.to_vector<double>();
  EXPECT_TRUE(std::isnan(l[0]));
  EXPECT_NEAR(l[1], std::log(std::exp(4.0) + std::exp(5.0) + std::exp(6.0)) - 5.0, 1e-5);
  sum(rows).backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  EXPECT_TRUE(std::isnan(g[0]));
  EXPECT_FALSE(std::isnan(g[3]));
}

TEST(SoftmaxLossNormCuda, IgnoredRowsAndCountStayOnTheDevice) {
  MT_SKIP_WITHOUT_CUDA();
  const Tensor logits = from_vector({0.5, -1, 2, 0, 3, 1, -2, 0.25, 1, 1, 0, -1}, {3, 4}, DType::f32);
  const Tensor target = i64_tensor({1, -100, 2}, {3});
  Tensor xc = raw::to(logits, cuda_device(0)).requires_grad_();
  Tensor xr = logits.clone().requires_grad_();
  const Tensor lc = cross_entropy(xc, raw::to(target, cuda_device(0)));
  const Tensor lr = cross_entropy(xr, target);
  EXPECT_NEAR(lc.item(), lr.item(), 1e-6);
  lc.backward();
  lr.backward();
  const std::vector<double> gc = xc.grad().to_vector<double>(), gr = xr.grad().to_vector<double>();
  for (size_t i = 0; i < gc.size(); ++i) EXPECT_NEAR(gc[i], gr[i], 1e-6) << i;
  const Tensor all_ignored = raw::to(i64_tensor({-100, -100, -100}, {3}), cuda_device(0));
  EXPECT_TRUE(std::isnan(cross_entropy(xc.detach(), all_ignored).item()));
}

}  // namespace
}  // namespace mt::testing
