// ops/math.h: the host's float tanh (its own, not the C library's) against tanh in double.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "ops/math.h"

namespace mt {
namespace {

float from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// The distance from r to the exact value in units of the float spacing at the exact value.
double ulps_from(float r, double exact) {
  const float near = static_cast<float>(std::fabs(exact));
  double ulp = static_cast<double>(std::nextafter(near, std::numeric_limits<float>::infinity())) - near;
  if (ulp == 0) ulp = std::numeric_limits<float>::denorm_min();
  return std::fabs(static_cast<double>(r) - exact) / ulp;
}

// Every 97th positive finite float (subnormals, the polynomial's range below 0.625, the
// exponential's above it, saturation at 1) and its negative: within 1.5 ulp, and odd.
TEST(MathTanh, FloatIsWithinOneAndAHalfUlpOfTheDoubleTanhAndOdd) {
  double worst = 0;
  float worst_at = 0;
  for (uint32_t bits = 0; bits < 0x7f800000u; bits += 97) {
    const float x = from_bits(bits);
    const float r = math::tanh(x);
    const double e = ulps_from(r, std::tanh(static_cast<double>(x)));
    if (e > worst) worst = e, worst_at = x;
    ASSERT_EQ(math::tanh(-x), -r) << x;
  }
  EXPECT_LE(worst, 1.5) << "at " << worst_at;
  for (const float x : {0.625f, std::nextafter(0.625f, 0.0f), 1e-30f, 9.0f, 44.0f, 89.0f}) {
    EXPECT_LE(ulps_from(math::tanh(x), std::tanh(static_cast<double>(x))), 1.5) << x;
  }
}

TEST(MathTanh, FloatKeepsTheSignOfZeroAndSaturatesAndPropagatesNan) {
  EXPECT_TRUE(std::signbit(math::tanh(-0.0f)));
  EXPECT_FALSE(std::signbit(math::tanh(0.0f)));
  EXPECT_EQ(math::tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(math::tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(math::tanh(1e30f), 1.0f);
  EXPECT_TRUE(std::isnan(math::tanh(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace mt
