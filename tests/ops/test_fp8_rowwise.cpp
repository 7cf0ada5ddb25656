// FP8 with one scale per row (ops/fp8/fp8_rowwise.h, Note [FP8 frozen base]): the row cast against
// hand-computed bytes and within its round-trip bound; fp8_rowwise_gemm's emulation as the scaled
// exact product; fp8_rowwise_linear's forward and input gradient against f64 within the bound the
// formats' rounding allows, and as its primitives composed bit for bit; no gradient for the weight
// and nothing of x kept; fp8_lora_linear as the base op plus lora_linear's branch; errors. CUDA: the
// row cast bit for bit against the CPU, the native GEMM against the emulation, the layer ops within
// the same bounds and close to the CPU; skipped without a GPU.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "ops/fp8/fp8_rowwise.h"
#include "ops/matmul/matmul.h"
#include "tests/ops/fp8_test_util.h"
#include "tests/ops/ops_test_util.h"

namespace mt::testing {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

constexpr double kUE4M3 = 1.0 / 16;                // E4M3's relative rounding: 3 mantissa bits
constexpr double kEtaE4M3 = 1.0 / 1024;            // half its subnormal spacing 2^-9, in scaled units
constexpr double kUE5M2 = 1.0 / 8;                 // E5M2's: 2 mantissa bits
constexpr double kEtaE5M2 = 1.0 / (1024.0 * 128);  // 2^-17

std::vector<uint8_t> bytes_of(const Tensor& q) {
  const Tensor h = raw::contiguous(raw::to(q, kCPU));
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.numel());
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  const std::vector<float> v = raw::to(t, kCPU).to_vector<float>();
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

Tensor leaf(const Shape& shape, double scale, uint64_t seed, Device device) {
  Generator gen(seed);
  return (randn(shape, DType::f32, &gen) * scale).to(device).requires_grad_(true);
}

// Rows of very different sizes: each row of randn times 10^u, u uniform in [-3, 3).
Tensor rows_of_many_sizes(int64_t rows, int64_t cols, uint64_t seed) {
  Generator gen(seed);
  const Tensor x = randn({rows, cols}, DType::f32, &gen);
  const Tensor mag = uniform({rows, 1}, -3.0, 3.0, DType::f32, &gen);
  return raw::contiguous(mul(x, exp(mul(mag, std::log(10.0)))));
}

// ---- the row cast ----

// Each row cast with 448 / max |row| (E4M3) or 57344 / max |row| (E5M2):
//   [1, -2, 0.5, 4]   s = 112: 112, -224, 56, 448, all on the grid
//   [3, 1, 0, 0]      s = 448 / 3: 448, 149.33 -> 144 (between 144 and 160), 0, 0
//   [0, 0, 0, 0]      s = 1 (nothing to scale): zeros, scale_inv 1
//   [NaN, 1, 0, 0]    a NaN max: s = 1, the NaN kept
//   [inf, -1, .5, 0]  an infinite max: s = 1, inf saturates to 448
void expect_hand_values(Device device) {
  const Tensor x =
      f32_tensor({1, -2, 0.5f, 4, 3, 1, 0, 0, 0, 0, 0, 0, kNaN, 1, 0, 0, kInf, -1, 0.5f, 0}, {5, 4}, device);
  const Fp8RowQuantized q = quantize_fp8_rows(x);
  EXPECT_EQ(q.data.dtype(), DType::f8e4m3);
  EXPECT_EQ(q.data.shape(), (Shape{5, 4}));
  EXPECT_EQ(q.scale_inv.shape(), (Shape{5}));
  const std::vector<uint8_t> want = {0x6e, 0xf6, 0x66, 0x7e, 0x7e, 0x71, 0x00, 0x00, 0x00, 0x00,
                                     0x00, 0x00, 0x7f, 0x38, 0x00, 0x00, 0x7e, 0xb8, 0x30, 0x00};
  EXPECT_EQ(bytes_of(q.data), want) << device.str();
  const float third = 448.0f / 3.0f;
  const std::vector<float> scale_inv = {1.0f / 112.0f, 1.0f / third, 1.0f, 1.0f, 1.0f};
  EXPECT_EQ(raw::to(q.scale_inv, kCPU).to_vector<float>(), scale_inv) << device.str();

  // A column scale multiplies first: [1, 2, -3, 0.5] * [2, 0.5, 1, 0] = [2, 1, -3, 0], s = 448 / 3:
  // 298.67 -> 288, 149.33 -> 144, -448, 0.
  const Tensor row = f32_tensor({1, 2, -3, 0.5f}, {1, 4}, device);
  const Fp8RowQuantized qc = quantize_fp8_rows(row, DType::f8e4m3, f32_tensor({2, 0.5f, 1, 0}, {4}, device));
  EXPECT_EQ(bytes_of(qc.data), (std::vector<uint8_t>{0x79, 0x71, 0xfe, 0x00})) << device.str();
  EXPECT_EQ(raw::to(qc.scale_inv, kCPU).to_vector<float>(), std::vector<float>{1.0f / third}) << device.str();

  // E5M2: s = 57344 / 4 = 14336: 14336, -28672, 7168, 57344.
  const Fp8RowQuantized q5 = quantize_fp8_rows(raw::narrow(x, 0, 0, 1), DType::f8e5m2);
  EXPECT_EQ(bytes_of(q5.data), (std::vector<uint8_t>{0x73, 0xf7, 0x6f, 0x7b})) << device.str();
}

TEST(Fp8RowCast, MatchesHandComputedValues) { expect_hand_values(kCPU); }

// x^ = q * scale_inv against x: |x^ - x| <= (u + 3 u32) |x| + 1.01 eta / s per element (u, eta:
// the format's relative rounding and half its subnormal spacing; the f32 roundings of x * s, of
// 1 / s and of q * scale_inv), and each row's largest element lands on the format's largest value.
void expect_round_trip(DType format, Device device) {
  const int64_t rows = 37, cols = 80;
  const Tensor x = rows_of_many_sizes(rows, cols, 7);
  const Fp8RowQuantized q = quantize_fp8_rows(x.to(device), format);
  const std::vector<double> back = values_of(mul(raw::to(q.data, DType::f32), raw::view(q.scale_inv, {rows, 1})));
  const std::vector<double> xv = values_of(x), sinv = values_of(q.scale_inv);
  const std::vector<uint8_t> bytes = bytes_of(q.data);
  const double u = (format == DType::f8e4m3 ? kUE4M3 : kUE5M2) + 3 * kU32;
  const double eta = format == DType::f8e4m3 ? kEtaE4M3 : kEtaE5M2;
  const uint8_t top = format == DType::f8e4m3 ? 0x7e : 0x7b;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t arg = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      ASSERT_LE(std::abs(back[i] - xv[i]), u * std::abs(xv[i]) + 1.01 * eta * sinv[r])
          << dtype_name(format) << " at (" << r << ", " << c << ") on " << device.str();
      if (std::abs(xv[i]) > std::abs(xv[r * cols + arg])) arg = c;
    }
    EXPECT_EQ(bytes[r * cols + arg] & 0x7f, top) << "row " << r << " on " << device.str();
  }
}

TEST(Fp8RowCast, RoundTripStaysWithinTheFormatsRounding) {
  expect_round_trip(DType::f8e4m3, kCPU);
  expect_round_trip(DType::f8e5m2, kCPU);
}

TEST(Fp8RowCast, ErrorsNameTheProblem) {
  expect_contains(error_of([] { quantize_fp8_rows(zeros({4})); }), {"quantize_fp8_rows", "2-D"});
  expect_contains(error_of([] { quantize_fp8_rows(zeros({2, 4}), DType::bf16); }), {"f8e4m3 or f8e5m2", "bf16"});
  expect_contains(error_of([] {
                    quantize_fp8_rows(zeros({2, 4}), DType::f8e4m3, zeros({3}));
                  }),
                  {"column_scale", "[4]"});
  expect_contains(error_of([] { quantize_fp8_rows(zeros({2, 4}, DType::i64)); }), {"quantize_fp8_rows", "i64"});
}

// ---- the GEMM ----

Tensor on_grid(const Shape& shape, DType format, uint64_t seed) {
  Generator gen(seed);
  return quantize_fp8(randn(shape, DType::f32, &gen) * 4.0, f32_scalar(1.0f), format).data;
}

Tensor positive(int64_t n, uint64_t seed) {
  Generator gen(seed);
  return uniform({n}, 0.01, 2.0, DType::f32, &gen);
}

// On-grid operands: every product is exact in f32, so the only errors are the f32 additions, the
// two multiplications by the factors and the bias's addition: with S_ij = sa_i sb_j sum_k |a b| +
// |bias_j|, |y - y_ref| <= gamma(K + 3) S_ij, and a bf16 output adds its rounding, 2^-8 |y_ref|.
void expect_emulation_is_the_scaled_product(DType out_dtype, bool with_bias, Device device) {
  const int64_t m = 32, n = 48, k = 64;
  const Tensor a = on_grid({m, k}, DType::f8e4m3, 1), b = on_grid({n, k}, DType::f8e4m3, 2);
  const Tensor sa = positive(m, 3), sb = positive(n, 4);
  Generator gen(5);
  const Tensor bias = with_bias ? randn({n}, DType::f32, &gen).to(DType::bf16) : Tensor();
  const Tensor y = fp8_rowwise_gemm(a.to(device), b.to(device), sa.to(device), sb.to(device), out_dtype,
                                    with_bias ? bias.to(device) : Tensor(), Fp8Compute::emulate);
  ASSERT_EQ(y.dtype(), out_dtype);
  const std::vector<double> av = values_of(a), bv = values_of(b), sav = values_of(sa), sbv = values_of(sb);
  const std::vector<double> bias_v = with_bias ? values_of(bias) : std::vector<double>(n, 0.0), got = values_of(y);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, mag = 0;
      for (int64_t l = 0; l < k; ++l) {
        dot += av[i * k + l] * bv[j * k + l];
        mag += std::abs(av[i * k + l] * bv[j * k + l]);
      }
      const double want = dot * sav[i] * sbv[j] + bias_v[j];
      double bound = gamma(k + 3) * (mag * sav[i] * sbv[j] + std::abs(bias_v[j]));
      if (out_dtype == DType::bf16) bound += kUBf16 * std::abs(want);
      ASSERT_LE(std::abs(got[i * n + j] - want), bound) << "(" << i << ", " << j << ") on " << device.str();
    }
  }
}

TEST(Fp8RowwiseGemm, EmulationIsTheScaledExactProduct) {
  for (const DType out : {DType::f32, DType::bf16}) {
    for (const bool with_bias : {false, true}) expect_emulation_is_the_scaled_product(out, with_bias, kCPU);
  }
}

TEST(Fp8RowwiseGemm, ErrorsNameTheProblem) {
  const Tensor a = on_grid({16, 32}, DType::f8e4m3, 1), b = on_grid({16, 32}, DType::f8e4m3, 2);
  const Tensor s = ones({16});
  expect_contains(error_of([&] { fp8_rowwise_gemm(a, b, ones({8}), s, DType::f32); }), {"row_scale_inv_a", "[16]"});
  expect_contains(error_of([&] { fp8_rowwise_gemm(a, b, s, s.to(DType::bf16), DType::f32); }),
                  {"row_scale_inv_b", "f32"});
  expect_contains(error_of([&] {
                    fp8_rowwise_gemm(a, on_grid({16, 24}, DType::f8e4m3, 3), s, s, DType::f32);
                  }),
                  {"a_q [M, K]", "[16, 24]"});
  const Tensor a5 = on_grid({16, 32}, DType::f8e5m2, 4);
  expect_contains(error_of([&] { fp8_rowwise_gemm(a5, a5, s, s, DType::f32); }), {"f8e5m2 x f8e5m2"});
  expect_contains(error_of([&] { fp8_rowwise_gemm(a, b, s, s, DType::f16); }), {"bf16 or f32", "f16"});
  expect_contains(error_of([&] { fp8_rowwise_gemm(a, b, s, s, DType::f32, Tensor(), Fp8Compute::native); }),
                  {"native FP8", "compute capability"});
}

// ---- the layer op ----

// y [P, R] against a [P, Q] b [R, Q]^T in f64, when each element of the operands the GEMM read is
// a's or b's within ea or eb (elementwise): per element
//   |y - a b^T| <= sum_q [ea |b| + |a| eb + ea eb] + g sum_q (|a| + ea) (|b| + eb),
// g = gamma(Q + 7) for the f32 additions and the products by the factors (2^-8 more for the tensor
// cores' own additions, as NativeMatchesTheEmulation allows). Statistically the roundings are
// uncorrelated, each at most u / sqrt(3) in RMS relative size, so the relative Frobenius error
// stays below sqrt(2) u / sqrt(3) = 0.051 for E4M3 operands.
void expect_within(const std::vector<double>& a, const std::vector<double>& ea, const std::vector<double>& b,
                   const std::vector<double>& eb, int64_t p, int64_t q, int64_t r, const Tensor& y, bool native,
                   const std::string& what) {
  ASSERT_EQ(y.numel(), p * r) << what;
  const std::vector<double> got = values_of(y);
  std::vector<double> ref(static_cast<size_t>(p * r));
  const double g = gamma(q + 7) + (native ? std::ldexp(1.0, -8) : 0.0);
  for (int64_t i = 0; i < p; ++i) {
    for (int64_t j = 0; j < r; ++j) {
      double dot = 0, bound = 0;
      for (int64_t l = 0; l < q; ++l) {
        const double x = a[i * q + l], w = b[j * q + l], ex = ea[i * q + l], ew = eb[j * q + l];
        dot += x * w;
        bound += ex * std::abs(w) + std::abs(x) * ew + ex * ew + g * (std::abs(x) + ex) * (std::abs(w) + ew);
      }
      ref[i * r + j] = dot;
      ASSERT_LE(std::abs(got[i * r + j] - dot), bound) << what << " at (" << i << ", " << j << ")";
    }
  }
  EXPECT_LE(relative_l2(got, ref), std::sqrt(2.0) * kUE4M3 / std::sqrt(3.0)) << what;
  EXPECT_GT(relative_l2(got, ref), 0.0) << what;  // the rounding is real
}

std::vector<double> row_amaxes(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows), 0.0);
  for (int64_t i = 0; i < rows * cols; ++i) out[i / cols] = std::max(out[i / cols], std::abs(v[i]));
  return out;
}

// The error bound of an operand cast per row to E4M3: (u + 3 u32) |v| + 1.01 eta amax_row / 448.
std::vector<double> row_cast_error(const std::vector<double>& v, int64_t rows, int64_t cols) {
  const std::vector<double> amax = row_amaxes(v, rows, cols);
  std::vector<double> e(v.size());
  for (int64_t i = 0; i < rows * cols; ++i) {
    e[i] = (kUE4M3 + 3 * kU32) * std::abs(v[i]) + 1.01 * kEtaE4M3 * amax[i / cols] / 448.0;
  }
  return e;
}

std::vector<double> transposed(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = v[i * cols + j];
  }
  return out;
}

// y = x W^T and dx = dy W against f64 with the original W (before its cast), each within the bound
// of the casts it went through:
//   forward  x per row and W per row (its channels): ex, ew as row_cast_error.
//   dgrad    g = dy * scale_inv_w (by column) cast per row, so dy is read to within
//            (u + 3 u32) |dy| + 1.01 eta amax_row(g) / 448 / scale_inv_w[n]; W^T's columns as above.
// The bias (rounded to bf16, as the GEMM reads it) and db (dy's row sums in f32) are checked exactly.
void expect_layer_within_bound(Device device, const Shape& x_shape, int64_t n) {
  const int64_t k = x_shape.back();
  const Tensor x = leaf(x_shape, 1.0, 11, device), w = leaf({n, k}, 0.05, 12, kCPU).detach();
  const Tensor b = leaf({n}, 0.1, 13, device);
  Shape y_shape = x_shape;
  y_shape.back() = n;
  Generator gen(14);
  const Tensor dy = (randn(y_shape, DType::f32, &gen) * 1e-3).to(device);
  const Fp8RowQuantized wq = quantize_fp8_rows(w.to(device));
  const Tensor y = fp8_rowwise_linear(x, wq.data, wq.scale_inv);
  ASSERT_EQ(y.shape(), y_shape);
  ASSERT_EQ(y.dtype(), DType::f32);
  y.backward(dy);
  const bool native = fp8_native_available(device);
  const std::string on =
      " " + shape_str(x_shape) + " x [" + std::to_string(n) + ", " + std::to_string(k) + "] on " + device.str();
  const int64_t m = x.numel() / k;
  const std::vector<double> xv = values_of(x.detach()), wv = values_of(w), dyv = values_of(dy);
  expect_within(xv, row_cast_error(xv, m, k), wv, row_cast_error(wv, n, k), m, k, n, y, native, "forward" + on);

  const std::vector<double> sw = values_of(wq.scale_inv);
  std::vector<double> g(dyv.size());
  for (int64_t i = 0; i < m * n; ++i) g[i] = dyv[i] * sw[i % n];
  const std::vector<double> g_amax = row_amaxes(g, m, n);
  std::vector<double> e_dy(dyv.size());
  for (int64_t i = 0; i < m * n; ++i) {
    e_dy[i] = (kUE4M3 + 3 * kU32) * std::abs(dyv[i]) + 1.01 * kEtaE4M3 * g_amax[i / n] / 448.0 / sw[i % n];
  }
  const std::vector<double> wt = transposed(wv, n, k);  // [K, N]: dx = dy (W^T)^T
  expect_within(dyv, e_dy, wt, transposed(row_cast_error(wv, n, k), n, k), m, n, k, x.grad(), native, "dgrad" + on);

  // With a bias: the same product plus the bias rounded to bf16, in f32; db = dy's column sums.
  const Tensor xb = x.detach().requires_grad_(true);
  const Tensor yb = fp8_rowwise_linear(xb, wq.data, wq.scale_inv, b);
  yb.backward(dy);
  const std::vector<double> plain = values_of(y), biased = values_of(yb), bias = values_of(b.detach().to(DType::bf16));
  for (size_t i = 0; i < plain.size(); ++i) {
    const double want = plain[i] + bias[i % static_cast<size_t>(n)];
    ASSERT_LE(std::abs(biased[i] - want), 2 * kU32 * (std::abs(plain[i]) + std::abs(want))) << i << on;
  }
  EXPECT_EQ(values_of(xb.grad()), values_of(x.grad())) << "the bias changes nothing of dx" << on;
  ASSERT_EQ(b.grad().dtype(), DType::f32);
  const std::vector<double> db = values_of(b.grad());
  for (int64_t j = 0; j < n; ++j) {
    double want = 0, mag = 0;
    for (int64_t i = 0; i < m; ++i) {
      want += dyv[i * n + j];
      mag += std::abs(dyv[i * n + j]);
    }
    ASSERT_LE(std::abs(db[j] - want), gamma(m) * mag) << "db " << j << on;
  }
}

TEST(Fp8RowwiseLinear, ForwardAndInputGradientStayWithinTheRoundingBound) {
  expect_layer_within_bound(kCPU, {32, 64}, 48);
  expect_layer_within_bound(kCPU, {3, 7, 64}, 48);  // 21 rows: padded to 32 inside the op
  expect_layer_within_bound(kCPU, {5, 128}, 96);
}

// The op is its primitives: the forward is fp8_rowwise_gemm of the per-row casts of x and W; dx is
// fp8_rowwise_gemm of dy's columns scaled by W's factors, cast per row, against W's transpose, with
// unit factors for the transpose's rows. Bit for bit, rows a multiple of 16 (no padding).
void expect_primitives_bit_for_bit(Device device) {
  const int64_t m = 32, k = 48, n = 64;
  const Tensor x = leaf({m, k}, 1.0, 21, device), w = leaf({n, k}, 0.05, 22, device).detach();
  Generator gen(23);
  const Tensor dy = randn({m, n}, DType::f32, &gen).to(device);
  const Fp8RowQuantized wq = quantize_fp8_rows(w);
  const Tensor y = fp8_rowwise_linear(x, wq.data, wq.scale_inv);
  y.backward(dy);
  const Fp8RowQuantized xq = quantize_fp8_rows(x.detach());
  EXPECT_EQ(values_of(y), values_of(fp8_rowwise_gemm(xq.data, wq.data, xq.scale_inv, wq.scale_inv, DType::f32)));
  const Fp8RowQuantized gq = quantize_fp8_rows(dy, DType::f8e4m3, wq.scale_inv);
  const Tensor w_t = raw::contiguous(raw::transpose(wq.data, 0, 1));
  const Tensor dx = fp8_rowwise_gemm(gq.data, w_t, gq.scale_inv, ones({k}).to(device), DType::f32);
  EXPECT_EQ(values_of(x.grad()), values_of(dx)) << device.str();
}

TEST(Fp8RowwiseLinear, IsItsPrimitivesComposedBitForBit) { expect_primitives_bit_for_bit(kCPU); }

// The FP8 weight is a constant: it gets no gradient, one that asks for it is refused, and the
// backward keeps nothing of x (x changed in place after the forward does not disturb it, which a
// saved x would report).
TEST(Fp8RowwiseLinear, TheWeightGetsNoGradientAndXIsNotKept) {
  const Tensor x = leaf({16, 32}, 1.0, 31, kCPU);
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({16, 32}, 0.05, 32, kCPU).detach());
  EXPECT_FALSE(wq.data.requires_grad());
  Tensor input = x * 1.0;  // not a leaf, so that it may change in place
  const Tensor y = fp8_rowwise_linear(input, wq.data, wq.scale_inv);
  {
    NoGradGuard no_grad;
    input.fill_(3.0);
  }
  sum(y).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(wq.data.grad().defined());
  EXPECT_FALSE(wq.scale_inv.grad().defined());
  Tensor scales = raw::clone(wq.scale_inv).requires_grad_(true);
  expect_contains(error_of([&] { fp8_rowwise_linear(x, wq.data, scales); }), {"fp8_rowwise_linear", "frozen"});
}

// Note [FP8 input cast reuse]: layer ops reading one unchanged input share its cast; an input
// changed in place, or another tensor, is cast again. Doubling x doubles each row's amax and so
// its factor, a power of two: y doubles exactly. A stale cast would give y again.
void expect_input_cast_follows_the_input(Device device) {
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({48, 32}, 0.05, 71, device).detach());
  const Fp8RowQuantized wq2 = quantize_fp8_rows(leaf({16, 32}, 0.05, 72, device).detach());
  NoGradGuard no_grad;
  Tensor x = leaf({3, 16, 32}, 1.0, 73, device).detach();
  const auto values = [](const Tensor& t) { return t.to(kCPU).to_vector<float>(); };
  const std::vector<float> y2_of_a_copy = values(fp8_rowwise_linear(raw::clone(x), wq2.data, wq2.scale_inv));
  const std::vector<float> y = values(fp8_rowwise_linear(x, wq.data, wq.scale_inv));
  // A second layer over the same x (as k after q): its own weight, the same cast of x.
  EXPECT_EQ(values(fp8_rowwise_linear(x, wq2.data, wq2.scale_inv)), y2_of_a_copy);
  x.copy_(x * 2.0);  // in place: a new version of the same storage, at the same address
  const std::vector<float> doubled = values(fp8_rowwise_linear(x, wq.data, wq.scale_inv));
  ASSERT_EQ(doubled.size(), y.size());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(doubled[i], 2.0f * y[i]) << "at " << i << " on " << device.str();
}

TEST(Fp8RowwiseLinear, AnInputChangedInPlaceIsCastAgain) { expect_input_cast_follows_the_input(kCPU); }

TEST(Fp8RowwiseLinearCuda, AnInputChangedInPlaceIsCastAgain) {
  MT_SKIP_WITHOUT_CUDA();
  expect_input_cast_follows_the_input(gpu());
}

// A captured forward keeps no cast of its own (a capture that still holds a tensor it allocated is
// refused), and each replay casts x as it is then.
TEST(Fp8RowwiseLinearCuda, GraphReplaysCastTheInputAsItIsAtEachReplay) {
  MT_SKIP_WITHOUT_CUDA();
  NoGradGuard no_grad;
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({48, 64}, 0.05, 81, gpu()).detach());
  const Tensor x = leaf({32, 64}, 1.0, 82, gpu()).detach();
  fp8_rowwise_linear(x, wq.data, wq.scale_inv);  // x's cast is now kept
  const Tensor out = empty({32, 48}, TensorOptions().dtype(DType::f32).device(gpu()));
  const cuda::Stream stream = cuda::current_stream(gpu().index);
  cuda::Graph graph;
  graph.capture(stream, [&] { out.copy_(fp8_rowwise_linear(x, wq.data, wq.scale_inv)); });
  for (int i = 0; i < 2; ++i) {
    if (i == 1) x.copy_(x * 2.0);
    graph.replay(stream);
    const Tensor eager = fp8_rowwise_linear(raw::clone(x), wq.data, wq.scale_inv);
    EXPECT_EQ(out.to(kCPU).to_vector<float>(), eager.to(DType::f32).to(kCPU).to_vector<float>()) << "replay " << i;
  }
}

TEST(Fp8RowwiseLinear, UnderAutocastTheOutputHasTheAutocastDtype) {
  const Tensor x = leaf({4, 16, 32}, 1.0, 41, kCPU);
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({48, 32}, 0.05, 42, kCPU).detach());
  const Tensor b = leaf({48}, 0.1, 43, kCPU);
  Tensor y;
  {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    y = fp8_rowwise_linear(x, wq.data, wq.scale_inv, b);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  sum(y).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f32);  // the cast's gradient comes back in x's dtype
  EXPECT_TRUE(b.grad().defined());
}

TEST(Fp8RowwiseLinear, ErrorsNameTheProblem) {
  const Tensor x = zeros({4, 32});
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({48, 32}, 0.05, 51, kCPU).detach());
  expect_contains(error_of([&] {
                    fp8_rowwise_linear(zeros({4, 24}), wq.data, wq.scale_inv);
                  }),
                  {"fp8_rowwise_linear", "[4, 24]", "[48, 32]"});
  const Fp8RowQuantized odd = quantize_fp8_rows(zeros({40, 24}));
  expect_contains(error_of([&] {
                    fp8_rowwise_linear(zeros({4, 24}), odd.data, odd.scale_inv);
                  }),
                  {"multiples of 16", "[40, 24]"});
  expect_contains(error_of([&] { fp8_rowwise_linear(x, raw::to(wq.data, DType::f32), wq.scale_inv); }),
                  {"weight_q", "f8e4m3"});
  expect_contains(error_of([&] { fp8_rowwise_linear(x, wq.data, ones({32})); }), {"weight_scale_inv", "[48]"});
  expect_contains(error_of([&] { fp8_rowwise_linear(x, wq.data, wq.scale_inv, zeros({32})); }), {"bias", "[48]"});
}

// fp8_lora_linear is fp8_rowwise_linear plus lora_linear's branch (lora_linear over a zero base):
// the output and every gradient agree up to the order of the last f32 additions.
void expect_lora_is_base_plus_branch(Device device) {
  const int64_t k = 32, n = 48, r = 4;
  const double scale = 2.0;
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({n, k}, 0.05, 61, device).detach());
  const Tensor bias = leaf({n}, 0.1, 62, device).detach();
  const auto run = [&](bool fused) {
    Tensor x = leaf({3, 5, k}, 1.0, 63, device), a = leaf({r, k}, 0.1, 64, device), b = leaf({n, r}, 0.1, 65, device);
    const Tensor y = fused
                         ? fp8_lora_linear(x, x, wq.data, wq.scale_inv, bias, a, b, scale)
                         : add(fp8_rowwise_linear(x, wq.data, wq.scale_inv, bias),
                               lora_linear(x, x, zeros({n, k}, TensorOptions().device(device)), Tensor(), a, b, scale));
    Generator gen(66);
    y.backward(randn(y.shape(), DType::f32, &gen).to(device));
    return std::vector<Tensor>{y.detach(), x.grad(), a.grad(), b.grad()};
  };
  const std::vector<Tensor> fused = run(true), composed = run(false);
  const char* names[] = {"y", "dx", "dA", "dB"};
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_EQ(fused[i].shape(), composed[i].shape()) << names[i];
    EXPECT_LT(relative_norm_error(fused[i], composed[i]), 1e-6) << names[i] << " on " << device.str();
  }
}

TEST(Fp8LoraLinear, IsTheBaseOpPlusLoraLinearsBranch) { expect_lora_is_base_plus_branch(kCPU); }

// OutputValues::unread records fp8_lora_linear as ever, its output left unwritten: from the same
// upstream gradient every gradient is the computed op's, bit for bit (linear's and lora_linear's:
// tests/ops/test_matmul.cpp).
void expect_unread_output_gives_the_same_gradients(Device device) {
  const int64_t k = 32, n = 48, r = 4;
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({n, k}, 0.05, 81, device).detach());
  const auto run = [&](OutputValues values) {
    Tensor x = leaf({3, 5, k}, 1.0, 83, device), a = leaf({r, k}, 0.1, 84, device), b = leaf({n, r}, 0.1, 85, device);
    const Tensor y = fp8_lora_linear(x, x, wq.data, wq.scale_inv, Tensor(), a, b, 2.0, values);
    EXPECT_EQ(y.shape(), (Shape{3, 5, n}));
    Generator gen(86);
    y.backward(randn(y.shape(), DType::f32, &gen).to(device));
    return std::vector<std::vector<float>>{x.grad().to_vector<float>(), a.grad().to_vector<float>(),
                                           b.grad().to_vector<float>()};
  };
  const auto computed = run(OutputValues::computed), unread = run(OutputValues::unread);
  const char* names[] = {"dx", "dA", "dB"};
  for (size_t i = 0; i < computed.size(); ++i) EXPECT_EQ(unread[i], computed[i]) << names[i] << " on " << device.str();
}

TEST(Fp8LoraLinear, AnUnreadOutputGivesTheSameGradients) { expect_unread_output_gives_the_same_gradients(kCPU); }
TEST(Fp8LoraLinearCuda, AnUnreadOutputGivesTheSameGradients) {
  MT_SKIP_WITHOUT_CUDA();
  expect_unread_output_gives_the_same_gradients(Device("cuda"));
}

TEST(Fp8LoraLinear, ErrorsNameTheProblem) {
  const Tensor x = zeros({4, 32});
  const Fp8RowQuantized wq = quantize_fp8_rows(leaf({48, 32}, 0.05, 71, kCPU).detach());
  expect_contains(error_of([&] {
                    fp8_lora_linear(x, x, wq.data, wq.scale_inv, Tensor(), zeros({4, 24}), zeros({48, 4}), 1);
                  }),
                  {"fp8_lora_linear", "lora_a", "[r, 32]"});
  expect_contains(error_of([&] {
                    fp8_lora_linear(x, x, wq.data, wq.scale_inv, Tensor(), zeros({4, 32}), zeros({32, 4}), 1);
                  }),
                  {"lora_b", "[48, 4]"});
  expect_contains(
      error_of([&] {
        fp8_lora_linear(x, zeros({4, 16}), wq.data, wq.scale_inv, Tensor(), zeros({4, 32}), zeros({48, 4}), 1);
      }),
      {"adapter's input", "[4, 16]"});
}

// ---- CUDA ----

// The row cast on the GPU against the CPU's bytes and factors, across the kernel's paths: rows kept
// in registers (1, 2, 4 and 8 packs a thread), rows read twice (too long, or columns not a multiple
// of 8), each input dtype, both formats, with and without a column scale, and rows holding a NaN,
// an infinity, only zeros or subnormal f32 values.
TEST(Fp8RowCastCuda, MatchesTheCpuBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  expect_hand_values(gpu());
  expect_round_trip(DType::f8e4m3, gpu());
  for (const int64_t cols : {int64_t{64}, int64_t{2048}, int64_t{3000}, int64_t{8192}, int64_t{8200}, int64_t{16384},
                             int64_t{20000}, int64_t{37}}) {
    Tensor x = rows_of_many_sizes(6, cols, 81 + cols);
    {
      NoGradGuard no_grad;
      raw::narrow(x, 0, 1, 1).fill_(0.0);
      raw::narrow(raw::narrow(x, 0, 2, 1), 1, cols / 2, 1).fill_(kNaN);
      raw::narrow(raw::narrow(x, 0, 3, 1), 1, 0, 1).fill_(-kInf);
      raw::narrow(x, 0, 4, 1).copy_(mul(raw::narrow(x, 0, 4, 1), 1e-40));  // subnormal f32
    }
    const Tensor cs = positive(cols, 91);
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      const Tensor xd = raw::to(x, dtype);
      for (const DType format : {DType::f8e4m3, DType::f8e5m2}) {
        for (const bool scaled : {false, true}) {
          const Fp8RowQuantized c = quantize_fp8_rows(xd, format, scaled ? cs : Tensor());
          const Fp8RowQuantized g = quantize_fp8_rows(xd.to(gpu()), format, scaled ? cs.to(gpu()) : Tensor());
          const std::string what = std::string(dtype_name(dtype)) + " -> " + dtype_name(format) + ", " +
                                   std::to_string(cols) + " columns" + (scaled ? ", column scale" : "");
          EXPECT_EQ(bytes_of(g.data), bytes_of(c.data)) << what;
          EXPECT_EQ(bits_of(g.scale_inv), bits_of(c.scale_inv)) << what;
        }
      }
    }
  }
}

// The native GEMM (cuBLASLt's outer-vector scales, or the unit-scale fallback) against the
// emulation on the same operands: within 2^-8 of the factors times sum_k |a b| per element (the
// tensor cores' order and internal width; a swapped factor vector would be off by the whole
// product), plus a bf16 output's rounding on each side.
void expect_native_matches_emulation(DType out, bool with_bias, int64_t m, int64_t n, int64_t k) {
  const Tensor a = on_grid({m, k}, DType::f8e4m3, 101), b = on_grid({n, k}, DType::f8e4m3, 102);
  const Tensor sa = positive(m, 103), sb = positive(n, 104);
  Generator gen(105);
  const Tensor bias = with_bias ? randn({n}, DType::f32, &gen).to(DType::bf16).to(gpu()) : Tensor();
  const Tensor native =
      fp8_rowwise_gemm(a.to(gpu()), b.to(gpu()), sa.to(gpu()), sb.to(gpu()), out, bias, Fp8Compute::native);
  const Tensor emulated =
      fp8_rowwise_gemm(a.to(gpu()), b.to(gpu()), sa.to(gpu()), sb.to(gpu()), out, bias, Fp8Compute::emulate);
  const std::string what = std::string("-> ") + dtype_name(out) + (with_bias ? " + bias" : "") + " [" +
                           std::to_string(m) + ", " + std::to_string(n) + ", " + std::to_string(k) + "]";
  ASSERT_EQ(native.dtype(), out) << what;
  const std::vector<double> av = values_of(a), bv = values_of(b), sav = values_of(sa), sbv = values_of(sb);
  const std::vector<double> got = values_of(native), want = values_of(emulated);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double mag = 0;
      for (int64_t l = 0; l < k; ++l) mag += std::abs(av[i * k + l] * bv[j * k + l]);
      double bound = std::ldexp(1.0, -8) * sav[i] * sbv[j] * mag;
      if (out == DType::bf16) bound += kUBf16 * (std::abs(got[i * n + j]) + std::abs(want[i * n + j]));
      ASSERT_LE(std::abs(got[i * n + j] - want[i * n + j]), bound) << what << " at (" << i << ", " << j << ")";
    }
  }
}

TEST(Fp8RowwiseGemmCuda, NativeMatchesTheEmulation) {
  MT_SKIP_WITHOUT_CUDA();
  if (!fp8_native_available(gpu())) GTEST_SKIP() << "this GPU has no FP8 tensor cores (compute capability below 8.9)";
  for (const DType out : {DType::bf16, DType::f32}) {
    for (const bool with_bias : {false, true}) expect_native_matches_emulation(out, with_bias, 64, 48, 128);
  }
  expect_native_matches_emulation(DType::bf16, false, 16, 16, 16);
  expect_native_matches_emulation(DType::bf16, true, 256, 512, 1024);
}

// The speed of the FP8 base rests on the outer-vector scales running inside the GEMM; cuBLASLt's
// documentation offers them for FP8 on Hopper (compute capability 9.0). A failure here means the
// slower second pass runs (fp8_rowwise_gemm's warning is the message), not a wrong result.
TEST(Fp8RowwiseGemmCuda, HopperRunsTheOuterVectorScalesInTheGemm) {
  MT_SKIP_WITHOUT_CUDA();
  if (cuda::compute_capability(0) != 90) GTEST_SKIP() << "not a Hopper GPU";
  const int64_t m = 4096, n = 2048, k = 2048;  // a Llama-3.2-1B projection's shape
  ::testing::internal::CaptureStderr();
  for (const DType out : {DType::bf16, DType::f32}) {
    fp8_rowwise_gemm(on_grid({m, k}, DType::f8e4m3, 121).to(gpu()), on_grid({n, k}, DType::f8e4m3, 122).to(gpu()),
                     positive(m, 123).to(gpu()), positive(n, 124).to(gpu()), out);
  }
  fp8_rowwise_gemm(on_grid({m, k}, DType::f8e4m3, 125).to(gpu()), on_grid({n, k}, DType::f8e4m3, 126).to(gpu()),
                   positive(m, 127).to(gpu()), positive(n, 128).to(gpu()), DType::bf16,
                   ones({n}, TensorOptions().dtype(DType::bf16).device(gpu())));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.find("outer-vector"), std::string::npos) << warnings;
}

TEST(Fp8RowwiseGemmCuda, EmulationIsTheScaledExactProduct) {
  MT_SKIP_WITHOUT_CUDA();
  for (const DType out : {DType::f32, DType::bf16}) {
    for (const bool with_bias : {false, true}) expect_emulation_is_the_scaled_product(out, with_bias, gpu());
  }
}

TEST(Fp8RowwiseLinearCuda, ForwardAndInputGradientStayWithinTheRoundingBound) {
  MT_SKIP_WITHOUT_CUDA();
  expect_layer_within_bound(gpu(), {32, 64}, 48);
  expect_layer_within_bound(gpu(), {3, 7, 64}, 48);
  expect_layer_within_bound(gpu(), {5, 128}, 96);
}

// The same layer on both devices: the casts are the same bits, so y and dx differ only by the
// GEMMs' order of addition (and the tensor cores' width): well within 2^-8 relatively.
TEST(Fp8RowwiseLinearCuda, MatchesTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const Tensor w = leaf({96, 128}, 0.05, 111, kCPU).detach();
  const Tensor b = leaf({96}, 0.1, 112, kCPU).detach();
  Generator gen(113);
  const Tensor dy = randn({2, 37, 96}, DType::f32, &gen);
  const auto run = [&](Device device, DType dtype) {
    const Tensor x = raw::to(leaf({2, 37, 128}, 1.0, 114, kCPU).detach(), dtype).to(device).requires_grad_(true);
    const Fp8RowQuantized wq = quantize_fp8_rows(w.to(device));
    const Tensor y = fp8_rowwise_linear(x, wq.data, wq.scale_inv, raw::to(b, dtype).to(device));
    y.backward(raw::to(dy, dtype).to(device));
    return std::vector<Tensor>{raw::to(y.detach(), DType::f32).to(kCPU), raw::to(x.grad(), DType::f32).to(kCPU)};
  };
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::vector<Tensor> c = run(kCPU, dtype), g = run(gpu(), dtype);
    EXPECT_LT(relative_norm_error(g[0], c[0]), std::ldexp(1.0, -8)) << "y " << dtype_name(dtype);
    EXPECT_LT(relative_norm_error(g[1], c[1]), std::ldexp(1.0, -8)) << "dx " << dtype_name(dtype);
  }
  expect_primitives_bit_for_bit(gpu());
}

TEST(Fp8LoraLinearCuda, IsTheBaseOpPlusLoraLinearsBranch) {
  MT_SKIP_WITHOUT_CUDA();
  expect_lora_is_base_plus_branch(gpu());
}

}  // namespace
}  // namespace mt::testing
