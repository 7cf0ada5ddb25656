// Math functions callable from host and device code with float or double.
// (CUDA's device overloads and the C library's host functions share these
// names: expf/exp, logf/log, ...; the wrappers pick the right one per type.)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/macros.h"

namespace mt::math {

MT_HOST_DEVICE inline float exp(float x) { return ::expf(x); }
MT_HOST_DEVICE inline double exp(double x) { return ::exp(x); }
MT_HOST_DEVICE inline float log(float x) { return ::logf(x); }
MT_HOST_DEVICE inline double log(double x) { return ::log(x); }
MT_HOST_DEVICE inline float sqrt(float x) { return ::sqrtf(x); }
MT_HOST_DEVICE inline double sqrt(double x) { return ::sqrt(x); }
// tanh of a float. On the host not glibc's tanhf, at about 20 ns an element on an x86-64
// core (random inputs): through it GELU (the GPT MLP's activation) and its derivative were
// over half of a CPU training step. Below 0.625 an odd polynomial, |x| + |x|^3 P(x^2), P fitted to
// (tanh(x) / x - 1) / x^2 by least squares reweighted towards the smallest largest error
// (Lawson's iteration); above, 1 - 2 / (exp(2|x|) + 1), where the quotient is at most 0.45. The
// exponential is computed here, not called: 2|x| clamped to [1.25, 20] (tanh rounds to 1 from 9.01
// on), split as n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor polynomial to r^7 (error under
// 1e-8 relative), times 2^n through the exponent bits. Both ranges are computed and one is
// selected, by compares of the bits, and the sign is put back last (-0 stays -0, tanh(-x) =
// -tanh(x)): no branch and no call, so that element loops over it vectorise (ops/loops.h; GCC
// also needs -fno-trapping-math to turn such selects into vector blends, see ops/CMakeLists.txt).
// Within 1.32 ulp of tanh in double over every 7th positive float; NaN stays NaN. The MathTanh
// tests check the accuracy. CUDA's device tanhf serves device code.
MT_HOST_DEVICE inline float tanh(float x) {
#ifdef __CUDA_ARCH__
  return ::tanhf(x);
#else
  const auto bits_of = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
  };
  const auto from_bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  };
  const uint32_t abs_bits = bits_of(x) & 0x7fffffffu;
  const float a = from_bits(abs_bits);
  const float z = a * a;
  const float p = (((-5.717044696211815e-3f * z + 2.0650586113333702e-2f) * z - 5.374349653720856e-2f) * z +
                   1.3331490755081177e-1f) *
                      z -
                  3.333328366279602e-1f;
  const float small = a + a * z * p;
  const float twice = 2.0f * a;
  float y = bits_of(twice) < 0x3fa00000u ? 1.25f : twice;  // below 1.25 (a < 0.625) the polynomial serves
  y = bits_of(twice) > 0x41a00000u ? 20.0f : y;            // beyond 20, inf and NaN: tanh is 1 (NaN below)
  const float n = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(y / ln 2): 12582912 = 1.5 * 2^23
  const float r = (y - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;  // ln 2 in two parts, the first exact
  float e = 1.0f / 5040.0f;
  e = e * r + 1.0f / 720.0f;
  e = e * r + 1.0f / 120.0f;
  e = e * r + 1.0f / 24.0f;
  e = e * r + 1.0f / 6.0f;
  e = e * r + 0.5f;
  e = e * r + 1.0f;
  e = e * r + 1.0f;
  e = from_bits(bits_of(e) + (static_cast<uint32_t>(static_cast<int32_t>(n)) << 23));  // times 2^n, n in [2, 29]
  const float big = 1.0f - 2.0f / (e + 1.0f);
  const float magnitude = abs_bits < 0x3f200000u ? small : big;  // 0x3f200000 = 0.625
  const float result = from_bits(bits_of(magnitude) | (bits_of(x) & 0x80000000u));
  return abs_bits > 0x7f800000u ? x + x : result;  // NaN: quieted, its sign and payload kept
#endif
}
MT_HOST_DEVICE inline double tanh(double x) { return ::tanh(x); }
MT_HOST_DEVICE inline float erf(float x) { return ::erff(x); }
MT_HOST_DEVICE inline double erf(double x) { return ::erf(x); }
MT_HOST_DEVICE inline float pow(float x, float y) { return ::powf(x, y); }
MT_HOST_DEVICE inline double pow(double x, double y) { return ::pow(x, y); }
MT_HOST_DEVICE inline float abs(float x) { return ::fabsf(x); }
MT_HOST_DEVICE inline double abs(double x) { return ::fabs(x); }
MT_HOST_DEVICE inline float log1p(float x) { return ::log1pf(x); }
MT_HOST_DEVICE inline double log1p(double x) { return ::log1p(x); }

template <typename T>
MT_HOST_DEVICE inline T max(T a, T b) {
  return a > b ? a : b;
}
template <typename T>
MT_HOST_DEVICE inline T min(T a, T b) {
  return a < b ? a : b;
}

}  // namespace mt::math
