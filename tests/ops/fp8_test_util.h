// Helpers shared by the FP8 tests (test_fp8.cpp, test_fp8_linear.cpp): exact f32 inputs, and the
// bound that FP8 rounding allows a GEMM of cast operands against f64.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/view.h"
#include "ops/fp8/fp8.h"
#include "ops/fp8/fp8_scaling.h"
#include "tests/test_util.h"

namespace mt::testing {

// f32 values as a tensor, bit for bit (NaN payloads kept).
inline Tensor f32_tensor(const std::vector<float>& v, const Shape& shape, Device device = kCPU) {
  return from_blob(v.data(), shape, DType::f32, TensorOptions().dtype(DType::f32).device(device));
}
inline Tensor f32_scalar(float v, Device device = kCPU) { return f32_tensor({v}, {1}, device); }

constexpr double kU32 = 5.9604644775390625e-8;  // f32's unit roundoff, 2^-24
constexpr double kUBf16 = 1.0 / 256;            // bf16's, 2^-8

inline double gamma(int64_t n) { return static_cast<double>(n) * kU32 / (1.0 - static_cast<double>(n) * kU32); }

inline std::vector<double> values_of(const Tensor& t) { return raw::to(t, DType::f64).to(kCPU).to_vector<double>(); }
inline double scalar_of(const Tensor& t) { return values_of(t)[0]; }

// Arbitrary f32 inputs a [P, Q], b [R, Q], each cast with its current scale s = fmax / amax, then
// y = fp8_gemm (f32 out) against a b^T in f64. A format with p significant bits rounds a value in
// its normal range with relative error at most u = 2^-p (E4M3: 2^-4, E5M2: 2^-3), and one in its
// subnormal range with absolute error at most eta (half the subnormal spacing: 2^-10 for E4M3,
// 2^-17 for E5M2) in scaled units. With the f32 roundings of a * s and of 1/s (2 u32 more), the
// dequantized a^ = q * fl(1/s) obeys |a^ - a| <= e(a) = (u + 3 u32) |a| + 1.01 eta / s. So
// |a^ b^ - a b| <= e(a) |b| + |a| e(b) + e(a) e(b) per product, and
//   |y_ij - (a b^T)_ij| <= sum_k [e(a_ik) |b_jk| + |a_ik| e(b_jk) + e(a_ik) e(b_jk)]
//                          + g sum_k (|a_ik| + e(a_ik)) (|b_jk| + e(b_jk)),
// g = gamma(Q + 3) for the f32 additions of the emulation; the native kernel's adds 2^-8 (as in
// NativeMatchesTheEmulation). That bound holds for every element. Statistically the rounding
// errors are uncorrelated and at most u / sqrt(3) in RMS relative size each (a uniform error
// within half a spacing), so the relative Frobenius error stays below sqrt(u_a^2 + u_b^2) /
// sqrt(3): 0.051 for E4M3 x E4M3, 0.081 with one E5M2 operand.
struct Cast {
  Tensor q;    // the FP8 operand as fp8_gemm reads it
  Fp8Scale s;  // its current scale
  DType format;
};

// a cast with its current scale on `device`, in `layout`.
inline Cast cast(const Tensor& a, DType format, Device device, Fp8Layout layout = Fp8Layout::as_is) {
  const Tensor on = a.to(device);
  const Fp8Scale s = current_scale(fp8_amax(on), format);
  return {quantize_fp8(on, s.scale, format, layout).data, s, format};
}

// a [P, Q] and b [R, Q] (f32 on the CPU, the values the casts came from) against y [P, R].
inline void expect_within_rounding_bound(const Tensor& a, const Tensor& b, const Cast& ca, const Cast& cb,
                                         const Tensor& y, bool native, const std::string& what) {
  const int64_t p = a.size(0), q = a.size(1), r = b.size(0);
  ASSERT_EQ(y.shape(), (Shape{p, r})) << what;
  const auto u_of = [](DType f) { return f == DType::f8e4m3 ? 1.0 / 16 : 1.0 / 8; };
  const auto eta_of = [](DType f) { return f == DType::f8e4m3 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17); };
  const double ua = u_of(ca.format) + 3 * kU32, ub = u_of(cb.format) + 3 * kU32;
  const double ea_abs = 1.01 * eta_of(ca.format) / scalar_of(ca.s.scale);
  const double eb_abs = 1.01 * eta_of(cb.format) / scalar_of(cb.s.scale);
  const double g = gamma(q + 3) + (native ? std::ldexp(1.0, -8) : 0.0);
  const std::vector<double> av = values_of(a), bv = values_of(b), got = values_of(y);
  std::vector<double> ref(static_cast<size_t>(p * r));
  for (int64_t i = 0; i < p; ++i) {
    for (int64_t j = 0; j < r; ++j) {
      double dot = 0, bound = 0;
      for (int64_t l = 0; l < q; ++l) {
        const double x = av[i * q + l], w = bv[j * q + l];
        const double ex = ua * std::abs(x) + ea_abs, ew = ub * std::abs(w) + eb_abs;
        dot += x * w;
        bound += ex * std::abs(w) + std::abs(x) * ew + ex * ew + g * (std::abs(x) + ex) * (std::abs(w) + ew);
      }
      ref[i * r + j] = dot;
      ASSERT_LE(std::abs(got[i * r + j] - dot), bound) << what << " at (" << i << ", " << j << ")";
    }
  }
  const double ua8 = u_of(ca.format), ub8 = u_of(cb.format);
  EXPECT_LE(relative_l2(got, ref), std::sqrt(ua8 * ua8 + ub8 * ub8) / std::sqrt(3.0)) << what;
  EXPECT_GT(relative_l2(got, ref), 0.0) << what;  // the rounding is real: a cast that kept a would hide it
}

}  // namespace mt::testing
