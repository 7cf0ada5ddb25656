// Op-contract cases for conv2d, max_pool2d and avg_pool2d (f64 gradcheck on the
// CPU, CUDA-vs-CPU per dtype), plus what the contract does not cover: conv2d
// against a naive 7-loop reference, the output-size formula, pooling semantics
// (argmax routing, padding), error messages, f64 on CUDA and larger CUDA shapes.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/view.h"
#include "ops/backends.h"
#include "ops/conv/conv.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

using In = std::vector<Tensor>;

// ---- conv2d: x [N, C, H, W], weight [O, C / groups, kH, kW], bias [O] ----
// cuDNN skips the zero padding that the CPU's im2col multiplies, and pads what the CPU's col2im
// skips: a NaN weight over a padded tap is NaN on one side and not on the other.
OpCase conv_case(const char* name) {
  return OpCase("conv2d", name)
      .cuda_nonfinite_may_differ("cuDNN and the CPU's im2col multiply different zeros of the padding");
}
MT_OP_CASE(conv_case("conv2d_bias").inputs({{2, 2, 5, 5}, {3, 2, 3, 3}, {3}}).compute([](const In& x) {
  return conv2d(x[0], x[1], x[2]);
}));
MT_OP_CASE(conv_case("conv2d_no_bias").inputs({{2, 2, 5, 5}, {3, 2, 3, 3}}).compute([](const In& x) {
  return conv2d(x[0], x[1]);
}));
MT_OP_CASE(conv_case("conv2d_stride2_pad1").inputs({{2, 2, 5, 5}, {3, 2, 3, 3}, {3}}).compute([](const In& x) {
  return conv2d(x[0], x[1], x[2], Conv2dOptions().stride(2).padding(1));
}));
MT_OP_CASE(conv_case("conv2d_dilation2").inputs({{2, 2, 5, 5}, {3, 2, 3, 3}}).compute([](const In& x) {
  return conv2d(x[0], x[1], Tensor(), Conv2dOptions().dilation(2).padding(1));
}));
MT_OP_CASE(conv_case("conv2d_groups2").inputs({{2, 4, 5, 5}, {4, 2, 3, 3}, {4}}).compute([](const In& x) {
  return conv2d(x[0], x[1], x[2], Conv2dOptions().groups(2).padding(1));
}));
MT_OP_CASE(conv_case("conv2d_depthwise").inputs({{2, 2, 5, 5}, {4, 1, 3, 3}}).compute([](const In& x) {
  return conv2d(x[0], x[1], Tensor(), Conv2dOptions().groups(2));
}));
// Height and width differ in every size and option, so a swapped h/w shows.
MT_OP_CASE(conv_case("conv2d_rect").inputs({{2, 2, 5, 6}, {3, 2, 3, 2}, {3}}).compute([](const In& x) {
  return conv2d(x[0], x[1], x[2], Conv2dOptions().stride(2, 1).padding(1, 0).dilation(1, 2));
}));

// ---- pooling: x [N, C, H, W]; max pooling draws away from zero (ties break gradchecks) ----
MT_OP_CASE(
    OpCase("max_pool2d", "max_pool2d_k2").inputs({{2, 2, 5, 5}}).draw(Values::away_from_zero).compute([](const In& x) {
      return max_pool2d(x[0], Pool2dOptions(2));
    }));
MT_OP_CASE(OpCase("max_pool2d", "max_pool2d_k3_s2_p1")
               .inputs({{2, 2, 5, 5}})
               .draw(Values::away_from_zero)
               .compute([](const In& x) { return max_pool2d(x[0], Pool2dOptions(3).stride(2).padding(1)); }));
MT_OP_CASE(OpCase("max_pool2d", "max_pool2d_rect")
               .inputs({{2, 2, 5, 6}})
               .draw(Values::away_from_zero)
               .compute([](const In& x) { return max_pool2d(x[0], Pool2dOptions(2, 3).stride(1, 2).padding(1, 0)); }));
MT_OP_CASE(OpCase("avg_pool2d", "avg_pool2d_k2").inputs({{2, 2, 5, 5}}).compute([](const In& x) {
  return avg_pool2d(x[0], Pool2dOptions(2));
}));
MT_OP_CASE(OpCase("avg_pool2d", "avg_pool2d_k3_s2_p1").inputs({{2, 2, 5, 5}}).compute([](const In& x) {
  return avg_pool2d(x[0], Pool2dOptions(3).stride(2).padding(1));
}));
MT_OP_CASE(OpCase("avg_pool2d", "avg_pool2d_rect").inputs({{2, 2, 5, 6}}).compute([](const In& x) {
  return avg_pool2d(x[0], Pool2dOptions(2, 3).stride(1, 2).padding(1, 0));
}));

// ---- references ----

int64_t conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// y[n, o, i, j] = b[o] + sum_{c, p, q} x[n, grp*Cg + c, i*sh - ph + p*dh, j*sw - pw + q*dw] * w[o, c, p, q]
Tensor naive_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), Cg = w.size(1), kH = w.size(2), kW = w.size(3), Og = O / o.groups();
  const int64_t OH = conv_out_size(H, kH, o.stride_h(), o.padding_h(), o.dilation_h());
  const int64_t OW = conv_out_size(W, kW, o.stride_w(), o.padding_w(), o.dilation_w());
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(O, 0.0);
  std::vector<double> y(static_cast<size_t>(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t oc = 0; oc < O; ++oc) {
      const int64_t grp = oc / Og;
      for (int64_t i = 0; i < OH; ++i) {
        for (int64_t j = 0; j < OW; ++j) {
          double acc = bv[oc];
          for (int64_t c = 0; c < Cg; ++c) {
            for (int64_t p = 0; p < kH; ++p) {
              for (int64_t q = 0; q < kW; ++q) {
                const int64_t ih = i * o.stride_h() - o.padding_h() + p * o.dilation_h();
                const int64_t iw = j * o.stride_w() - o.padding_w() + q * o.dilation_w();
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += xv[((n * C + grp * Cg + c) * H + ih) * W + iw] * wv[((oc * Cg + c) * kH + p) * kW + q];
              }
            }
          }
          y[((n * O + oc) * OH + i) * OW + j] = acc;
        }
      }
    }
  }
  return from_vector(y, {N, O, OH, OW}, DType::f64);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> u = a.to_vector<double>(), v = b.to_vector<double>();
  EXPECT_EQ(u.size(), v.size());
  double m = 0;
  for (size_t i = 0; i < u.size() && i < v.size(); ++i) m = std::max(m, std::fabs(u[i] - v[i]));
  return m;
}

double rel_norm_diff(const Tensor& got, const Tensor& ref) {
  const std::vector<double> u = got.to_vector<double>(), v = ref.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    diff += (u[i] - v[i]) * (u[i] - v[i]);
    norm += v[i] * v[i];
  }
  return std::sqrt(diff / norm);
}

struct ConvConfig {
  Shape x, w;
  bool bias;
  Conv2dOptions options;
};

std::vector<ConvConfig> conv_configs() {
  return {{{2, 3, 7, 6}, {4, 3, 3, 3}, true, Conv2dOptions()},
          {{2, 3, 7, 6}, {4, 3, 3, 3}, false, Conv2dOptions().stride(2).padding(1)},
          {{1, 2, 9, 8}, {3, 2, 3, 2}, true, Conv2dOptions().dilation(2, 3).padding(2, 1)},
          {{2, 4, 6, 6}, {6, 2, 3, 3}, true, Conv2dOptions().groups(2).padding(1).stride(1, 2)},
          {{2, 4, 5, 5}, {4, 1, 3, 3}, false, Conv2dOptions().groups(4).padding(1)},
          {{1, 2, 4, 4}, {3, 2, 1, 1}, true, Conv2dOptions().stride(3)},
          {{1, 1, 3, 3}, {1, 1, 5, 5}, false, Conv2dOptions().padding(1)}};
}

// ---- conv2d ----

TEST(Conv2d, MatchesNaiveLoopsInF64) {
  Generator gen(7);
  for (const ConvConfig& c : conv_configs()) {
    const Tensor x = randn(c.x, DType::f64, &gen), w = randn(c.w, DType::f64, &gen);
    const Tensor b = c.bias ? randn({c.w[0]}, DType::f64, &gen) : Tensor();
    const Tensor got = conv2d(x, w, b, c.options), ref = naive_conv2d(x, w, b, c.options);
    ASSERT_EQ(got.shape(), ref.shape()) << shape_str(c.x) << " " << shape_str(c.w);
    EXPECT_LT(max_abs_diff(got, ref), 1e-12) << shape_str(c.x) << " " << shape_str(c.w);
  }
}

TEST(Conv2d, OutputShapeFollowsTheFormula) {
  const Tensor x = zeros({2, 2, 11, 9}, DType::f64);
  for (int64_t k : {1, 2, 3}) {
    for (int64_t s : {1, 2, 3}) {
      for (int64_t p : {0, 1, 2}) {
        for (int64_t d : {1, 2}) {
          const Tensor w = zeros({3, 2, k, k + 1}, DType::f64);
          const Shape got = conv2d(x, w, Tensor(), Conv2dOptions().stride(s).padding(p).dilation(d)).shape();
          const Shape want = {2, 3, conv_out_size(11, k, s, p, d), conv_out_size(9, k + 1, s, p, d)};
          EXPECT_EQ(got, want) << "k " << k << " s " << s << " p " << p << " d " << d;
        }
      }
    }
  }
}

TEST(Conv2d, ErrorsNameTheOpAndTheShapes) {
  const Tensor x = zeros({2, 3, 5, 5});
  std::string msg = error_message_of([&] { conv2d(x, zeros({4, 2, 3, 3})); });
  EXPECT_NE(msg.find("conv2d: channel mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3, 5, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 2, 3, 3]"), std::string::npos) << msg;

  msg = error_message_of([&] { conv2d(x, zeros({4, 3, 6, 3})); });
  EXPECT_NE(msg.find("conv2d: kernel 6x3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bigger than the padded input 5x5"), std::string::npos) << msg;
  msg = error_message_of([&] { conv2d(x, zeros({4, 3, 3, 3}), Tensor(), Conv2dOptions().dilation(3)); });
  EXPECT_NE(msg.find("(7x7 with dilation 3x3) is bigger than the padded input 5x5"), std::string::npos) << msg;
  EXPECT_EQ(conv2d(x, zeros({4, 3, 6, 3}), Tensor(), Conv2dOptions().padding(1)).shape(), (Shape{2, 4, 2, 5}));

  msg = error_message_of([&] { conv2d(x, zeros({4, 1, 3, 3}), Tensor(), Conv2dOptions().groups(2)); });
  EXPECT_NE(msg.find("conv2d: groups = 2 does not divide the 3 input channels"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3, 5, 5]"), std::string::npos) << msg;
  msg = error_message_of([&] {
    conv2d(zeros({2, 4, 5, 5}), zeros({3, 2, 3, 3}), Tensor(), Conv2dOptions().groups(2));
  });
  EXPECT_NE(msg.find("conv2d: groups = 2 does not divide the 3 output channels"), std::string::npos) << msg;

  msg = error_message_of([&] { conv2d(x, zeros({4, 3, 3, 3}), zeros({3})); });
  EXPECT_NE(msg.find("conv2d: expected a bias of shape [4]"), std::string::npos) << msg;
  msg = error_message_of([&] { conv2d(x, zeros({4, 3, 3, 3}, DType::f64)); });
  EXPECT_NE(msg.find("conv2d: x and weight have different dtypes"), std::string::npos) << msg;
  msg = error_message_of([&] { conv2d(zeros({3, 5, 5}), zeros({4, 3, 3, 3})); });
  EXPECT_NE(msg.find("conv2d: expected x of shape [N, C, H, W], got f32[3, 5, 5]"), std::string::npos) << msg;
  msg = error_message_of([&] { conv2d(x, zeros({4, 3, 3, 3}), Tensor(), Conv2dOptions().stride(0)); });
  EXPECT_NE(msg.find("conv2d: the stride must be positive"), std::string::npos) << msg;
  EXPECT_THROW(conv2d(x, zeros({4, 3, 6, 3})), ShapeError);
}

// Each gradient is computed only when asked for, and equals the one from a run
// where everything requires grad.
TEST(Conv2d, OnlyRequestedGradientsAreComputed) {
  Generator gen(11);
  const Tensor x0 = randn({2, 2, 5, 5}, DType::f64, &gen), w0 = randn({3, 2, 3, 3}, DType::f64, &gen);
  const Tensor b0 = randn({3}, DType::f64, &gen), dy = randn({2, 3, 3, 3}, DType::f64, &gen);
  auto run = [&](bool gx, bool gw, bool gb) {
    Tensor x = raw::clone(x0).requires_grad_(gx), w = raw::clone(w0).requires_grad_(gw);
    Tensor b = raw::clone(b0).requires_grad_(gb);
    conv2d(x, w, b).backward(dy);
    return std::vector<Tensor>{x.grad(), w.grad(), b.grad()};
  };
  const std::vector<Tensor> all = run(true, true, true);
  for (int mask = 1; mask < 7; ++mask) {
    const std::vector<Tensor> some = run(mask & 1, mask & 2, mask & 4);
    for (int k = 0; k < 3; ++k) {
      const bool wanted = mask & (1 << k);
      ASSERT_EQ(some[k].defined(), wanted) << "mask " << mask << " input " << k;
      if (wanted) EXPECT_EQ(max_abs_diff(some[k], all[k]), 0.0) << "mask " << mask << " input " << k;
    }
  }
  // The bias gradient is dy summed over N, OH, OW.
  const std::vector<double> db = all[2].to_vector<double>(), g = dy.to_vector<double>();
  for (int64_t o = 0; o < 3; ++o) {
    double want = 0;
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t e = 0; e < 9; ++e) want += g[static_cast<size_t>((n * 3 + o) * 9 + e)];
    }
    EXPECT_NEAR(db[static_cast<size_t>(o)], want, 1e-12);
  }
}

TEST(Conv2d, NonContiguousInputsGiveTheSameResult) {
  Generator gen(3);
  const Tensor x = randn({2, 2, 6, 5}, DType::f64, &gen), w = randn({3, 3, 2, 3}, DType::f64, &gen);
  const Tensor xt = x.transpose(2, 3), wt = w.permute({0, 2, 1, 3});  // [2, 2, 5, 6] and [3, 2, 3, 3]
  ASSERT_FALSE(xt.is_contiguous());
  const Tensor got = conv2d(xt, wt, Tensor(), Conv2dOptions().padding(1));
  const Tensor want = conv2d(xt.contiguous(), wt.contiguous(), Tensor(), Conv2dOptions().padding(1));
  EXPECT_EQ(max_abs_diff(got, want), 0.0);
}

TEST(Conv2d, LowPrecisionOnTheCpuMatchesF64) {
  Generator gen(5);
  const Tensor x = randn({2, 4, 7, 7}, DType::f64, &gen), w = randn({6, 2, 3, 3}, DType::f64, &gen);
  const Tensor b = randn({6}, DType::f64, &gen);
  const Conv2dOptions o = Conv2dOptions().groups(2).padding(1).stride(2);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const double tol = dtype == DType::f32 ? 1e-6 : dtype == DType::bf16 ? 1e-2 : 2e-3;
    const Tensor xl = raw::to(x, dtype), wl = raw::to(w, dtype), bl = raw::to(b, dtype);
    Tensor xr = raw::to(xl, DType::f64).requires_grad_(), wr = raw::to(wl, DType::f64).requires_grad_();
    Tensor xg = raw::clone(xl).requires_grad_(), wg = raw::clone(wl).requires_grad_();
    const Tensor yr = conv2d(xr, wr, raw::to(bl, DType::f64), o), yl = conv2d(xg, wg, bl, o);
    ASSERT_EQ(yl.dtype(), dtype);
    EXPECT_LT(rel_norm_diff(yl, yr), tol) << dtype_name(dtype);
    const Tensor dy = randn(yr.shape(), DType::f64, &gen);
    yr.backward(raw::to(raw::to(dy, dtype), DType::f64));
    yl.backward(raw::to(dy, dtype));
    EXPECT_LT(rel_norm_diff(xg.grad(), xr.grad()), tol) << dtype_name(dtype);
    EXPECT_LT(rel_norm_diff(wg.grad(), wr.grad()), tol) << dtype_name(dtype);
  }
}

TEST(Conv2d, EmptyBatch) {
  Tensor x = zeros({0, 2, 5, 5}, DType::f64).requires_grad_(), w = ones({3, 2, 3, 3}, DType::f64).requires_grad_();
  const Tensor y = conv2d(x, w, Tensor(), Conv2dOptions().padding(1));
  EXPECT_EQ(y.shape(), (Shape{0, 3, 5, 5}));
  sum(y).backward();
  EXPECT_EQ(w.grad().shape(), w.shape());
  EXPECT_EQ(sum(abs(w.grad())).item(), 0.0);
}

// ---- pooling ----

TEST(MaxPool2d, ValuesAndArgmaxRouting) {
  // One 4x4 plane; 2x2 windows. The last window holds a tie (7, 7): the first wins.
  Tensor x = from_vector({1, 5, 2, 0,   //
                          3, 4, 7, 6,   //
                          -1, 8, 7, 2,  //
                          0, 2, 3, 7},
                         {1, 1, 4, 4}, DType::f64)
                 .requires_grad_();
  const Tensor y = max_pool2d(x, Pool2dOptions(2));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{5, 7, 8, 7}));
  y.backward(from_vector({1, 2, 3, 4}, {1, 1, 2, 2}, DType::f64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 1, 0, 0,  //
                                                               0, 0, 2, 0,  //
                                                               0, 3, 4, 0,  //
                                                               0, 0, 0, 0}));
}

TEST(MaxPool2d, OverlappingWindowsAccumulateAndPaddingNeverWins) {
  // All negative: a padded zero would win if padding were read as a value.
  Tensor x = from_vector({-5, -1, -4, -2, -3, -6, -7, -8, -9}, {1, 1, 3, 3}, DType::f64).requires_grad_();
  const Tensor y = max_pool2d(x, Pool2dOptions(3).stride(1).padding(1));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{-1, -1, -1, -1, -1, -1, -2, -2, -3}));
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 6, 0, 2, 1, 0, 0, 0, 0}));
}

TEST(MaxPool2d, NanPropagates) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = from_vector({1, nan, 2, 3}, {1, 1, 2, 2}, DType::f64);
  EXPECT_TRUE(std::isnan(max_pool2d(x, Pool2dOptions(2)).item()));
}

TEST(AvgPool2d, PaddingCountsInTheDivisor) {
  Tensor x = ones({1, 1, 3, 3}, DType::f64).requires_grad_();
  const Tensor y = avg_pool2d(x, Pool2dOptions(3).stride(1).padding(1));
  const std::vector<double> v = y.to_vector<double>();
  const std::vector<double> want = {4. / 9, 6. / 9, 4. / 9, 6. / 9, 1, 6. / 9, 4. / 9, 6. / 9, 4. / 9};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(v[i], want[i], 1e-15) << i;
  sum(y).backward();
  // Each input is in as many windows as its 3x3 neighbourhood has in-image centres.
  const std::vector<double> g = x.grad().to_vector<double>();
  const std::vector<double> gwant = {4. / 9, 6. / 9, 4. / 9, 6. / 9, 1, 6. / 9, 4. / 9, 6. / 9, 4. / 9};
  for (size_t i = 0; i < gwant.size(); ++i) EXPECT_NEAR(g[i], gwant[i], 1e-15) << i;
}

TEST(Pool2d, OutputShapeAndDefaultStride) {
  const Tensor x = zeros({2, 3, 7, 6});
  EXPECT_EQ(max_pool2d(x, Pool2dOptions(2)).shape(), (Shape{2, 3, 3, 3}));
  EXPECT_EQ(avg_pool2d(x, Pool2dOptions(3, 2)).shape(), (Shape{2, 3, 2, 3}));
  EXPECT_EQ(avg_pool2d(x, Pool2dOptions(3).stride(2).padding(1)).shape(), (Shape{2, 3, 4, 3}));
  EXPECT_EQ(max_pool2d(x, Pool2dOptions(2, 3).stride(1, 2).padding(1, 0)).shape(), (Shape{2, 3, 8, 2}));
}

TEST(Pool2d, LowPrecisionOnTheCpuMatchesF64) {
  Generator gen(9);
  const Tensor x = randn({2, 3, 6, 7}, DType::f64, &gen);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor xl = raw::to(x, dtype), xr = raw::to(xl, DType::f64);
    const Pool2dOptions o = Pool2dOptions(3).stride(2).padding(1);
    // Max pooling picks one of the inputs, exactly; averaging rounds once.
    EXPECT_EQ(max_abs_diff(max_pool2d(xl, o), max_pool2d(xr, o)), 0.0) << dtype_name(dtype);
    EXPECT_LT(rel_norm_diff(avg_pool2d(xl, o), avg_pool2d(xr, o)), dtype == DType::f32 ? 1e-6 : 1e-2)
        << dtype_name(dtype);
  }
}

TEST(Pool2d, ErrorsNameTheOpAndTheShapes) {
  const Tensor x = zeros({2, 3, 5, 5});
  std::string msg = error_message_of([&] { max_pool2d(x, Pool2dOptions(2).padding(2)); });
  EXPECT_NE(msg.find("max_pool2d: padding 2x2 must be at most half the kernel 2x2"), std::string::npos) << msg;
  msg = error_message_of([&] { avg_pool2d(x, Pool2dOptions(6)); });
  EXPECT_NE(msg.find("avg_pool2d: kernel 6x6 is bigger than the padded input 5x5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3, 5, 5]"), std::string::npos) << msg;
  EXPECT_EQ(avg_pool2d(x, Pool2dOptions(6).padding(3)).shape(), (Shape{2, 3, 1, 1}));
  msg = error_message_of([&] { max_pool2d(zeros({3, 5, 5}), Pool2dOptions(2)); });
  EXPECT_NE(msg.find("max_pool2d: expected x of shape [N, C, H, W], got f32[3, 5, 5]"), std::string::npos) << msg;
  msg = error_message_of([&] { avg_pool2d(x, Pool2dOptions(2).stride(0)); });
  EXPECT_NE(msg.find("avg_pool2d: the stride must be positive"), std::string::npos) << msg;
}

// ---- CUDA beyond the contract: f64 (the contract checks f32/bf16/f16) and a
// larger problem, where cuDNN's heuristics pick other algorithms ----

// Runs f(inputs) forward and backward on the CPU in f64 and on CUDA in `dtype`
// (both from the same rounded inputs), and compares the output and every input's
// gradient by relative norm.
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
void expect_cuda_matches_cpu(const std::string& what, DType dtype, double tol, const std::vector<Tensor>& inputs,
                             const Fn& f) {
  std::vector<Tensor> ref, gpu;
  for (const Tensor& t : inputs) {
    // Fresh leaves on both sides: raw::to returns its input when nothing changes,
    // and a shared leaf would accumulate gradients across calls.
    const Tensor rounded = raw::to(t, dtype);
    ref.push_back(raw::clone(raw::to(rounded, DType::f64)).requires_grad_());
    gpu.push_back(raw::to(rounded, cuda_device(0)).requires_grad_());
  }
  const Tensor yr = f(ref), yg = f(gpu);
  ASSERT_TRUE(yg.is_cuda()) << what;
  ASSERT_EQ(yg.dtype(), dtype) << what;
  EXPECT_LT(rel_norm_diff(yg, yr), tol) << what << " " << dtype_name(dtype) << ": forward";
  Generator gen(17);
  const Tensor dy = raw::to(randn(yr.shape(), DType::f64, &gen), dtype);
  yr.backward(raw::to(dy, DType::f64));
  yg.backward(raw::to(dy, cuda_device(0)));
  for (size_t k = 0; k < inputs.size(); ++k) {
    ASSERT_TRUE(gpu[k].grad().defined()) << what << ": input " << k;
    EXPECT_LT(rel_norm_diff(gpu[k].grad(), ref[k].grad()), tol)
        << what << " " << dtype_name(dtype) << ": gradient of input " << k;
  }
}

TEST(Conv2dCuda, F64MatchesTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(21);
  for (const ConvConfig& c : conv_configs()) {
    std::vector<Tensor> in = {randn(c.x, DType::f64, &gen), randn(c.w, DType::f64, &gen)};
    if (c.bias) in.push_back(randn({c.w[0]}, DType::f64, &gen));
    expect_cuda_matches_cpu("conv2d " + shape_str(c.x) + " " + shape_str(c.w), DType::f64, 1e-12, in,
                            [&](const In& t) { return conv2d(t[0], t[1], c.bias ? t[2] : Tensor(), c.options); });
  }
  const std::vector<Tensor> x = {randn({2, 3, 7, 6}, DType::f64, &gen)};
  for (const Pool2dOptions& o : {Pool2dOptions(2), Pool2dOptions(3).stride(2).padding(1), Pool2dOptions(2, 3)}) {
    expect_cuda_matches_cpu("max_pool2d", DType::f64, 1e-12, x, [&](const In& t) { return max_pool2d(t[0], o); });
    expect_cuda_matches_cpu("avg_pool2d", DType::f64, 1e-12, x, [&](const In& t) { return avg_pool2d(t[0], o); });
  }
}

// cuDNN's max pooling propagates NaN like the CPU (CUDNN_PROPAGATE_NAN).
TEST(Conv2dCuda, MaxPoolNanPropagates) {
  MT_SKIP_WITHOUT_CUDA();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::f64, DType::f32}) {
    const Tensor x = raw::to(from_vector({1, nan, 2, 3}, {1, 1, 2, 2}, dtype), cuda_device(0));
    EXPECT_TRUE(std::isnan(max_pool2d(x, Pool2dOptions(2)).item())) << dtype_name(dtype);
  }
}

// A tie does not split or duplicate the gradient: it all goes to one element of
// the window (cuDNN's choice; the CPU takes the first).
TEST(Conv2dCuda, MaxPoolTieSendsTheGradientToOneElement) {
  MT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    Tensor x = raw::to(ones({1, 1, 2, 2}, dtype), cuda_device(0)).requires_grad_();
    sum(max_pool2d(x, Pool2dOptions(2))).backward();
    const std::vector<double> g = x.grad().to_vector<double>();
    int nonzero = 0;
    for (double v : g) nonzero += v != 0.0;
    EXPECT_EQ(nonzero, 1) << dtype_name(dtype) << ": " << x.grad().str();
    EXPECT_EQ(g[0] + g[1] + g[2] + g[3], 1.0) << dtype_name(dtype);
  }
}

TEST(Conv2dCuda, LargerProblemsMatchTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  backends::TF32Guard exact_f32(/*matmul=*/false, /*conv=*/false);  // f32 held to f32 accuracy
  Generator gen(23);
  const Tensor x = randn({4, 16, 24, 24}, DType::f64, &gen), b = randn({32}, DType::f64, &gen);
  const Tensor w3 = mul(randn({32, 16, 3, 3}, DType::f64, &gen), 0.1);
  const Tensor w1 = mul(randn({32, 16, 1, 1}, DType::f64, &gen), 0.1);
  const Tensor wg = mul(randn({32, 4, 5, 5}, DType::f64, &gen), 0.1);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const double tol = dtype == DType::f64 ? 1e-12 : dtype == DType::f32 ? 1e-5 : dtype == DType::bf16 ? 2e-2 : 4e-3;
    expect_cuda_matches_cpu("conv2d 3x3 pad 1 + bias", dtype, tol, {x, w3, b},
                            [](const In& t) { return conv2d(t[0], t[1], t[2], Conv2dOptions().padding(1)); });
    expect_cuda_matches_cpu("conv2d 1x1 stride 2", dtype, tol, {x, w1},
                            [](const In& t) { return conv2d(t[0], t[1], Tensor(), Conv2dOptions().stride(2)); });
    expect_cuda_matches_cpu("conv2d 5x5 groups 4 dilation 2", dtype, tol, {x, wg}, [](const In& t) {
      return conv2d(t[0], t[1], Tensor(), Conv2dOptions().groups(4).dilation(2).padding(4));
    });
    expect_cuda_matches_cpu("max_pool2d 3 stride 2 pad 1", dtype, dtype == DType::f64 ? 1e-12 : tol, {x},
                            [](const In& t) { return max_pool2d(t[0], Pool2dOptions(3).stride(2).padding(1)); });
    expect_cuda_matches_cpu("avg_pool2d 3 stride 2 pad 1", dtype, tol, {x},
                            [](const In& t) { return avg_pool2d(t[0], Pool2dOptions(3).stride(2).padding(1)); });
  }
}

}  // namespace
}  // namespace mt::testing
