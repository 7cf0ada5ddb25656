// Contracts of core/dtype.h and core/float_types.h.
//
// The f32 -> narrow conversions are checked against a reference written here
// from the formats' definitions (sign, exponent, mantissa, bias, subnormals) and
// Note [Conversion rule]: round to nearest, ties to the even mantissa; f16/bf16
// overflow to inf, f8 saturates to its largest finite value (inf included); NaN
// stays NaN with its sign. The reference never calls the library's decoders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/float_types.h"

namespace {

using mt::DType;

float bits_to_float(uint32_t u) { return mt::bits::u32_to_f32(u); }
uint32_t float_to_bits(float f) { return mt::bits::f32_to_u32(f); }

std::string describe(float x) {
  std::ostringstream out;
  out << std::hexfloat << x << std::defaultfloat << " (" << x << ", bits 0x" << std::hex << float_to_bits(x) << ")";
  return out.str();
}

// One narrow format: its definition (for the reference) and the library's
// conversions (under test).
struct NarrowFormat {
  const char* name;
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee_specials;  // an all-ones exponent holds inf and NaN; else (e4m3fn) only S.1111.111 is NaN
  bool saturates;      // overflow, inf included, clips to the largest finite value
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);
  // Range of f32 exponent fields the random sweep draws from (covers the format's
  // subnormals, its overflow and a margin on each side).
  uint32_t sweep_min_exp;
  uint32_t sweep_max_exp;

  uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  uint32_t num_patterns() const { return sign_bit() << 1; }
  uint32_t exp_field(uint32_t code) const { return (code >> man_bits) & ((1u << exp_bits) - 1u); }
  uint32_t man_field(uint32_t code) const { return code & ((1u << man_bits) - 1u); }
  bool all_ones_exp(uint32_t code) const { return exp_field(code) == (1u << exp_bits) - 1u; }
  bool is_nan(uint32_t code) const {
    if (ieee_specials) return all_ones_exp(code) && man_field(code) != 0;
    return all_ones_exp(code) && man_field(code) == (1u << man_bits) - 1u;
  }
  bool is_inf(uint32_t code) const { return ieee_specials && all_ones_exp(code) && man_field(code) == 0; }
  bool is_finite(uint32_t code) const { return !is_nan(code) && !is_inf(code); }

  // The value of a finite code, from the definition.
  double value(uint32_t code) const {
    const uint32_t e = exp_field(code), m = man_field(code);
    const double magnitude =
        e == 0 ? std::ldexp(static_cast<double>(m), 1 - bias - man_bits)
               : std::ldexp(static_cast<double>((1u << man_bits) | m), static_cast<int>(e) - bias - man_bits);
    return (code & sign_bit()) ? -magnitude : magnitude;
  }
};

const NarrowFormat kF16{"f16",
                        /*exp_bits=*/5,
                        /*man_bits=*/10,
                        /*bias=*/15,
                        /*ieee_specials=*/true,
                        /*saturates=*/false,
                        [](float f) -> uint32_t { return mt::bits::f32_to_f16(f); },
                        [](uint32_t b) { return mt::bits::f16_to_f32(static_cast<uint16_t>(b)); },
                        /*sweep_min_exp=*/127 - 30,
                        /*sweep_max_exp=*/127 + 18};
const NarrowFormat kBF16{"bf16",
                         /*exp_bits=*/8,
                         /*man_bits=*/7,
                         /*bias=*/127,
                         /*ieee_specials=*/true,
                         /*saturates=*/false,
                         [](float f) -> uint32_t { return mt::bits::f32_to_bf16(f); },
                         [](uint32_t b) { return mt::bits::bf16_to_f32(static_cast<uint16_t>(b)); },
                         /*sweep_min_exp=*/0,
                         /*sweep_max_exp=*/255};
const NarrowFormat kF8E4M3{"f8e4m3",
                           /*exp_bits=*/4,
                           /*man_bits=*/3,
                           /*bias=*/7,
                           /*ieee_specials=*/false,
                           /*saturates=*/true,
                           [](float f) -> uint32_t { return mt::bits::f32_to_f8e4m3(f); },
                           [](uint32_t b) { return mt::bits::f8e4m3_to_f32(static_cast<uint8_t>(b)); },
                           /*sweep_min_exp=*/127 - 14,
                           /*sweep_max_exp=*/127 + 11};
const NarrowFormat kF8E5M2{"f8e5m2",
                           /*exp_bits=*/5,
                           /*man_bits=*/2,
                           /*bias=*/15,
                           /*ieee_specials=*/true,
                           /*saturates=*/true,
                           [](float f) -> uint32_t { return mt::bits::f32_to_f8e5m2(f); },
                           [](uint32_t b) { return mt::bits::f8e5m2_to_f32(static_cast<uint8_t>(b)); },
                           /*sweep_min_exp=*/127 - 22,
                           /*sweep_max_exp=*/127 + 18};

// The reference rounding rule over the table of a format's non-negative finite values.
class Reference {
 public:
  explicit Reference(const NarrowFormat& f) : f_(f) {
    // Non-negative codes are ordered by magnitude; the finite ones come first.
    for (uint32_t c = 0; c < f.sign_bit() && f.is_finite(c); ++c) values_.push_back(f.value(c));
    max_code_ = static_cast<uint32_t>(values_.size() - 1);
    // Where rounding past the largest finite value would land (one ulp further).
    beyond_ = 2 * values_[max_code_] - values_[max_code_ - 1];
  }

  uint32_t max_code() const { return max_code_; }
  double max_value() const { return values_[max_code_]; }
  double beyond_max() const { return beyond_; }
  double value(uint32_t non_negative_code) const { return values_[non_negative_code]; }

  // The expected encoding of a non-NaN x.
  uint32_t expected(float x) const {
    const uint32_t sign = std::signbit(x) ? f_.sign_bit() : 0u;
    const double a = std::fabs(static_cast<double>(x));
    // `beyond_` has code max_code_ + 1: the inf code of an IEEE-like format.
    uint32_t code = max_code_ + 1;
    if (a < beyond_) {
      const auto hi = static_cast<uint32_t>(std::upper_bound(values_.begin(), values_.end(), a) - values_.begin());
      const uint32_t lo = hi - 1;
      const double v_lo = values_[lo];
      const double v_hi = hi <= max_code_ ? values_[hi] : beyond_;
      // 2a and v_lo + v_hi are exact in double, so the comparison is exact.
      const double twice = 2 * a, sum = v_lo + v_hi;
      if (a == v_lo || twice < sum) {
        code = lo;
      } else if (twice > sum) {
        code = hi;
      } else {
        code = (lo & 1u) == 0 ? lo : hi;  // a tie: the even mantissa
      }
    }
    if (code > max_code_ && f_.saturates) code = max_code_;
    return sign | code;
  }

 private:
  const NarrowFormat& f_;
  std::vector<double> values_;  // [max_code_ + 1], values_[c] = value of code c
  uint32_t max_code_ = 0;
  double beyond_ = 0;
};

// Checks encode(x) against the reference; returns "" or a description of the mismatch.
std::string check_conversion(const NarrowFormat& f, const Reference& ref, float x) {
  const uint32_t got = f.encode(x);
  std::ostringstream out;
  if (std::isnan(x)) {
    if (!f.is_nan(got) || ((got & f.sign_bit()) != 0) != std::signbit(x)) {
      out << f.name << "(" << describe(x) << ") = 0x" << std::hex << got << ", expected a NaN of the same sign";
    }
  } else if (got != ref.expected(x)) {
    out << f.name << "(" << describe(x) << ") = 0x" << std::hex << got << ", expected 0x" << ref.expected(x);
  }
  return out.str();
}

// Runs check_conversion over `inputs`; one failure names the count and the first few mismatches.
void expect_all_convert(const NarrowFormat& f, const std::vector<float>& inputs) {
  const Reference ref(f);
  int64_t mismatches = 0;
  std::string first;
  for (float x : inputs) {
    const std::string m = check_conversion(f, ref, x);
    if (m.empty()) continue;
    if (++mismatches <= 8) first += "\n  " + m;
  }
  EXPECT_EQ(mismatches, 0) << "of " << inputs.size() << " inputs; first mismatches:" << first;
}

class NarrowFormatTest : public ::testing::TestWithParam<const NarrowFormat*> {
 protected:
  const NarrowFormat& format() const { return *GetParam(); }
};

// Every pattern, NaNs included, comes back unchanged; the one exception is f8e5m2's
// +-inf, which the conversion rule saturates to +-57344 (0x7b / 0xfb).
TEST_P(NarrowFormatTest, EveryBitPatternRoundTripsThroughF32) {
  const NarrowFormat& f = format();
  const Reference ref(f);
  int mismatches = 0;
  for (uint32_t code = 0; code < f.num_patterns(); ++code) {
    const uint32_t back = f.encode(f.decode(code));
    const uint32_t expected = f.is_inf(code) && f.saturates ? (code & f.sign_bit()) | ref.max_code() : code;
    if (back != expected && ++mismatches <= 8) {
      ADD_FAILURE() << f.name << " pattern 0x" << std::hex << code << " -> " << describe(f.decode(code)) << " -> 0x"
                    << back;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(NarrowFormatTest, DecodingFollowsTheFormatDefinition) {
  const NarrowFormat& f = format();
  int mismatches = 0;
  for (uint32_t code = 0; code < f.num_patterns(); ++code) {
    const float got = f.decode(code);
    const bool negative = (code & f.sign_bit()) != 0;
    bool ok;
    if (f.is_nan(code)) {
      ok = std::isnan(got) && std::signbit(got) == negative;
    } else if (f.is_inf(code)) {
      ok = std::isinf(got) && std::signbit(got) == negative;
    } else {
      ok = static_cast<double>(got) == f.value(code) && std::signbit(got) == negative;  // -0 keeps its sign
    }
    if (!ok && ++mismatches <= 8) {
      ADD_FAILURE() << f.name << " pattern 0x" << std::hex << code << " decodes to " << describe(got);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// Every representable value, every midpoint between neighbours (ties), the f32
// numbers just either side of both, and the overflow / underflow edges, both signs.
TEST_P(NarrowFormatTest, ConvertsEveryTieAndNeighbourLikeTheReference) {
  const NarrowFormat& f = format();
  const Reference ref(f);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> inputs;
  auto add_with_neighbours = [&](double v) {
    const auto x = static_cast<float>(v);
    ASSERT_EQ(static_cast<double>(x), v) << "edge value not exact in f32";
    inputs.insert(inputs.end(), {x, std::nextafter(x, 0.0f), std::nextafter(x, inf)});
  };
  for (uint32_t c = 0; c < ref.max_code(); ++c) {
    add_with_neighbours(ref.value(c));
    add_with_neighbours((ref.value(c) + ref.value(c + 1)) / 2);
  }
  add_with_neighbours(ref.max_value());
  add_with_neighbours((ref.max_value() + ref.beyond_max()) / 2);                                     // max + half ulp
  if (ref.beyond_max() <= std::numeric_limits<float>::max()) add_with_neighbours(ref.beyond_max());  // not for bf16
  add_with_neighbours(ref.value(1) / 2);      // half the smallest subnormal
  add_with_neighbours(ref.value(1) * 3 / 4);  // between half and one smallest subnormal
  inputs.insert(inputs.end(), {inf, std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN(),
                               bits_to_float(0x7f800001u), bits_to_float(0x7fbfffffu)});
  const size_t n = inputs.size();
  for (size_t i = 0; i < n; ++i) inputs.push_back(-inputs[i]);
  expect_all_convert(f, inputs);
}

// 2^21 random f32 patterns: 15/16 with exponents across the format's range, 1/16 uniform over all 2^32.
TEST_P(NarrowFormatTest, ConvertsRandomF32LikeTheReference) {
  const NarrowFormat& f = format();
  std::mt19937 rng(20240531u);
  std::uniform_int_distribution<uint32_t> exp_dist(f.sweep_min_exp, f.sweep_max_exp);
  std::vector<float> inputs(size_t{1} << 21);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const uint32_t r = rng();
    uint32_t bits = r;
    if (i % 16 != 0) bits = (r & 0x807fffffu) | (exp_dist(rng) << 23);
    inputs[i] = bits_to_float(bits);
  }
  expect_all_convert(f, inputs);
}

INSTANTIATE_TEST_SUITE_P(Formats, NarrowFormatTest, ::testing::Values(&kF16, &kBF16, &kF8E4M3, &kF8E5M2),
                         [](const ::testing::TestParamInfo<const NarrowFormat*>& info) {
                           return std::string(info.param->name);
                         });

// ---- hand-written edge cases: pin the rule (and the reference) to literal bits ----

struct EdgeCase {
  float input;
  uint32_t expected;
  const char* what;
};

void expect_edge_cases(const NarrowFormat& f, const std::vector<EdgeCase>& cases) {
  const Reference ref(f);
  for (const EdgeCase& c : cases) {
    EXPECT_EQ(f.encode(c.input), c.expected) << f.name << ": " << c.what << ", input " << describe(c.input);
    EXPECT_EQ(ref.expected(c.input), c.expected) << "reference disagrees: " << c.what;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(f.is_nan(f.encode(nan))) << f.name << ": NaN";
  EXPECT_TRUE(f.is_nan(f.encode(-nan)) && (f.encode(-nan) & f.sign_bit())) << f.name << ": -NaN keeps its sign";
}

float p2(int e) { return std::ldexp(1.0f, e); }
float up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float down(float x) { return std::nextafter(x, 0.0f); }
const float kInf = std::numeric_limits<float>::infinity();

TEST(ConversionEdgeCases, F16) {
  expect_edge_cases(kF16, {
                              {1.0f, 0x3c00, "one"},
                              {1 + p2(-11), 0x3c00, "tie between 0x3c00 and 0x3c01 goes down to even"},
                              {up(1 + p2(-11)), 0x3c01, "just above that tie"},
                              {1 + 3 * p2(-11), 0x3c02, "tie between 0x3c01 and 0x3c02 goes up to even"},
                              {down(1 + 3 * p2(-11)), 0x3c01, "just below that tie"},
                              {65504.0f, 0x7bff, "largest finite"},
                              {down(65520.0f), 0x7bff, "just below max + half ulp"},
                              {65520.0f, 0x7c00, "max + half ulp: tie goes to inf (max is odd)"},
                              {1e6f, 0x7c00, "overflow"},
                              {kInf, 0x7c00, "inf"},
                              {-kInf, 0xfc00, "-inf"},
                              {p2(-24), 0x0001, "smallest subnormal"},
                              {p2(-25), 0x0000, "half the smallest subnormal: tie to even zero"},
                              {up(p2(-25)), 0x0001, "a bit more than half the smallest subnormal"},
                              {3 * p2(-25), 0x0002, "tie between subnormals 1 and 2"},
                              {5 * p2(-25), 0x0002, "tie between subnormals 2 and 3"},
                              {-p2(-25), 0x8000, "negative underflow keeps the sign"},
                              {-0.0f, 0x8000, "negative zero"},
                              {p2(-14), 0x0400, "smallest normal"},
                              {down(p2(-14)), 0x0400, "just below the smallest normal rounds up to it"},
                              {p2(-14) - p2(-25), 0x0400, "tie between largest subnormal and smallest normal"},
                              {p2(-14) - 3 * p2(-25), 0x03fe, "tie between 0x3fe and 0x3ff"},
                              {-2.5f, 0xc100, "negative normal"},
                          });
}

TEST(ConversionEdgeCases, BF16) {
  const float max = std::ldexp(255.0f, 120);  // 0x7f7f: (2 - 2^-7) * 2^127
  const float max_plus_half_ulp = std::ldexp(511.0f, 119);
  expect_edge_cases(kBF16, {
                               {1.0f, 0x3f80, "one"},
                               {1 + p2(-8), 0x3f80, "tie goes down to even"},
                               {up(1 + p2(-8)), 0x3f81, "just above that tie"},
                               {1 + 3 * p2(-8), 0x3f82, "tie goes up to even"},
                               {down(1 + 3 * p2(-8)), 0x3f81, "just below that tie"},
                               {max, 0x7f7f, "largest finite"},
                               {down(max_plus_half_ulp), 0x7f7f, "just below max + half ulp"},
                               {max_plus_half_ulp, 0x7f80, "max + half ulp: tie goes to inf"},
                               {std::numeric_limits<float>::max(), 0x7f80, "f32 max overflows"},
                               {kInf, 0x7f80, "inf"},
                               {-kInf, 0xff80, "-inf"},
                               {p2(-133), 0x0001, "smallest subnormal"},
                               {p2(-134), 0x0000, "half the smallest subnormal"},
                               {up(p2(-134)), 0x0001, "a bit more than that"},
                               {3 * p2(-134), 0x0002, "tie between subnormals 1 and 2"},
                               {std::numeric_limits<float>::denorm_min(), 0x0000, "f32's smallest subnormal"},
                               {-0.0f, 0x8000, "negative zero"},
                               {-p2(-140), 0x8000, "negative underflow keeps the sign"},
                               {p2(-126), 0x0080, "smallest normal"},
                               {p2(-126) - p2(-134), 0x0080, "tie between largest subnormal and smallest normal"},
                           });
}

TEST(ConversionEdgeCases, F8E4M3) {
  expect_edge_cases(kF8E4M3, {
                                 {1.0f, 0x38, "one"},
                                 {1 + p2(-4), 0x38, "tie goes down to even"},
                                 {up(1 + p2(-4)), 0x39, "just above that tie"},
                                 {1 + 3 * p2(-4), 0x3a, "tie goes up to even"},
                                 {down(1 + 3 * p2(-4)), 0x39, "just below that tie"},
                                 {416.0f, 0x7d, "second largest"},
                                 {432.0f, 0x7e, "tie between 416 and 448 goes to even 448"},
                                 {448.0f, 0x7e, "largest finite"},
                                 {464.0f, 0x7e, "max + half ulp: tie to even 448"},
                                 {up(464.0f), 0x7e, "rounds past 448: saturates"},
                                 {480.0f, 0x7e, "the NaN slot's value saturates"},
                                 {1e9f, 0x7e, "overflow saturates"},
                                 {kInf, 0x7e, "inf saturates"},
                                 {-kInf, 0xfe, "-inf saturates"},
                                 {p2(-9), 0x01, "smallest subnormal"},
                                 {p2(-10), 0x00, "half the smallest subnormal"},
                                 {up(p2(-10)), 0x01, "a bit more than that"},
                                 {3 * p2(-10), 0x02, "tie between subnormals 1 and 2"},
                                 {-0.0f, 0x80, "negative zero"},
                                 {-p2(-11), 0x80, "negative underflow keeps the sign"},
                                 {p2(-6), 0x08, "smallest normal"},
                                 {p2(-6) - p2(-10), 0x08, "tie between largest subnormal and smallest normal"},
                                 {down(p2(-6)), 0x08, "just below the smallest normal"},
                             });
}

TEST(ConversionEdgeCases, F8E5M2) {
  expect_edge_cases(kF8E5M2, {
                                 {1.0f, 0x3c, "one"},
                                 {1 + p2(-3), 0x3c, "tie goes down to even"},
                                 {up(1 + p2(-3)), 0x3d, "just above that tie"},
                                 {1 + 3 * p2(-3), 0x3e, "tie goes up to even"},
                                 {down(1 + 3 * p2(-3)), 0x3d, "just below that tie"},
                                 {53248.0f, 0x7a, "tie between 49152 and 57344 goes to even 49152"},
                                 {57344.0f, 0x7b, "largest finite"},
                                 {down(61440.0f), 0x7b, "just below max + half ulp"},
                                 {61440.0f, 0x7b, "max + half ulp saturates"},
                                 {65536.0f, 0x7b, "the inf slot's value saturates"},
                                 {1e30f, 0x7b, "overflow saturates"},
                                 {kInf, 0x7b, "inf saturates"},
                                 {-kInf, 0xfb, "-inf saturates"},
                                 {p2(-16), 0x01, "smallest subnormal"},
                                 {p2(-17), 0x00, "half the smallest subnormal"},
                                 {up(p2(-17)), 0x01, "a bit more than that"},
                                 {3 * p2(-17), 0x02, "tie between subnormals 1 and 2"},
                                 {-0.0f, 0x80, "negative zero"},
                                 {-p2(-18), 0x80, "negative underflow keeps the sign"},
                                 {p2(-14), 0x04, "smallest normal"},
                                 {p2(-14) - p2(-17), 0x04, "tie between largest subnormal and smallest normal"},
                             });
}

TEST(ConversionEdgeCases, NaNPayloadSurvivesTheRoundTripOrBecomesQuiet) {
  // A payload that fits is kept...
  EXPECT_EQ(mt::bits::f32_to_f16(bits_to_float(0x7f802000u)), 0x7c01);
  EXPECT_EQ(mt::bits::f32_to_bf16(bits_to_float(0xff810000u)), 0xff81);
  // ...and one that would vanish becomes the quiet bit, never inf.
  EXPECT_EQ(mt::bits::f32_to_f16(bits_to_float(0x7f800001u)), 0x7e00);
  EXPECT_EQ(mt::bits::f32_to_bf16(bits_to_float(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(mt::bits::f32_to_f8e5m2(bits_to_float(0xff800001u)), 0xfe);
  EXPECT_EQ(mt::bits::f32_to_f8e4m3(bits_to_float(0x7f800001u)), 0x7f);
}

// ---- the storage structs agree with the bits:: functions ----

template <typename T>
struct FormatOf;
template <>
struct FormatOf<mt::Half> {
  static const NarrowFormat& get() { return kF16; }
};
template <>
struct FormatOf<mt::BFloat16> {
  static const NarrowFormat& get() { return kBF16; }
};
template <>
struct FormatOf<mt::Float8E4M3> {
  static const NarrowFormat& get() { return kF8E4M3; }
};
template <>
struct FormatOf<mt::Float8E5M2> {
  static const NarrowFormat& get() { return kF8E5M2; }
};

template <typename T>
class NarrowStructTest : public ::testing::Test {};
using NarrowStructs = ::testing::Types<mt::Half, mt::BFloat16, mt::Float8E4M3, mt::Float8E5M2>;
struct StructNames {
  template <typename T>
  static std::string GetName(int) {
    return FormatOf<T>::get().name;
  }
};
TYPED_TEST_SUITE(NarrowStructTest, NarrowStructs, StructNames);

TYPED_TEST(NarrowStructTest, AgreesWithBitsFunctions) {
  using T = TypeParam;
  const NarrowFormat& f = FormatOf<T>::get();
  static_assert(sizeof(T) * 8 == sizeof(typename T::Storage) * 8, "a struct is exactly its bits");
  ASSERT_EQ(sizeof(T) * 8, static_cast<size_t>(1 + f.exp_bits + f.man_bits));
  for (uint32_t code = 0; code < f.num_patterns(); ++code) {
    const auto value = static_cast<float>(T::from_bits(static_cast<typename T::Storage>(code)));
    ASSERT_EQ(float_to_bits(value), float_to_bits(f.decode(code))) << f.name << " pattern 0x" << std::hex << code;
  }
  std::mt19937 rng(7u);
  for (int i = 0; i < 100000; ++i) {
    const float x = bits_to_float(rng());
    ASSERT_EQ(static_cast<uint32_t>(T(x).x), f.encode(x)) << f.name << "(" << describe(x) << ")";
  }
  EXPECT_EQ(T().x, 0) << "a default-constructed value is +0";
}

// ---- DType metadata ----

const DType kAllDTypes[] = {DType::f64,    DType::f32, DType::f16, DType::bf16, DType::f8e4m3,
                            DType::f8e5m2, DType::i64, DType::i32, DType::u8,   DType::boolean};

TEST(DTypeNames, NameAndParseRoundTrip) {
  for (DType t : kAllDTypes) EXPECT_EQ(mt::parse_dtype(mt::dtype_name(t)), t) << mt::dtype_name(t);
  EXPECT_STREQ(mt::dtype_name(DType::boolean), "bool");
  EXPECT_STREQ(mt::dtype_name(DType::f8e4m3), "f8e4m3");
  EXPECT_EQ(mt::parse_dtype("float32"), DType::f32);
  EXPECT_EQ(mt::parse_dtype("float"), DType::f32);
  EXPECT_EQ(mt::parse_dtype("half"), DType::f16);
  EXPECT_EQ(mt::parse_dtype("float16"), DType::f16);
  EXPECT_EQ(mt::parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(mt::parse_dtype("double"), DType::f64);
}

TEST(DTypeNames, UnknownNameThrowsDTypeErrorNamingIt) {
  try {
    mt::parse_dtype("nope");
    FAIL() << "parse_dtype(\"nope\") did not throw";
  } catch (const mt::DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mt::parse_dtype(""), mt::DTypeError);
  EXPECT_THROW(mt::parse_dtype("F32"), mt::DTypeError);
}

TEST(DTypeMetadata, ElementSizes) {
  const size_t expected[] = {8, 4, 2, 2, 1, 1, 8, 4, 1, 1};  // in kAllDTypes order
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    EXPECT_EQ(mt::element_size(kAllDTypes[i]), expected[i]) << mt::dtype_name(kAllDTypes[i]);
  }
  static_assert(mt::element_size(DType::bf16) == 2, "usable in constant expressions");
}

TEST(DTypeMetadata, Categories) {
  for (DType t : kAllDTypes) {
    EXPECT_NE(mt::is_floating(t), mt::is_integral(t)) << mt::dtype_name(t) << " is exactly one of the two";
    if (mt::is_compute_floating(t)) EXPECT_TRUE(mt::is_floating(t)) << mt::dtype_name(t);
  }
  EXPECT_TRUE(mt::is_floating(DType::f8e5m2));
  EXPECT_FALSE(mt::is_compute_floating(DType::f8e4m3));
  EXPECT_TRUE(mt::is_compute_floating(DType::bf16));
  EXPECT_TRUE(mt::is_integral(DType::boolean));
}

struct Promotion {
  DType a, b, expected;
};

TEST(DTypePromotion, Table) {
  const Promotion table[] = {
      {DType::f16, DType::bf16, DType::f32},
      {DType::f32, DType::f64, DType::f64},
      {DType::i64, DType::f16, DType::f16},
      {DType::boolean, DType::u8, DType::u8},
      {DType::u8, DType::i32, DType::i32},
      {DType::i32, DType::i64, DType::i64},
      {DType::boolean, DType::i64, DType::i64},
      {DType::i64, DType::f64, DType::f64},
      {DType::f32, DType::bf16, DType::f32},
      {DType::f8e4m3, DType::f8e5m2, DType::f32},
      {DType::f8e5m2, DType::f16, DType::f16},
      {DType::f8e4m3, DType::bf16, DType::bf16},
      {DType::boolean, DType::f8e4m3, DType::f8e4m3},
      {DType::u8, DType::bf16, DType::bf16},
  };
  for (const Promotion& p : table) {
    EXPECT_EQ(mt::promote_types(p.a, p.b), p.expected) << mt::dtype_name(p.a) << " + " << mt::dtype_name(p.b);
    EXPECT_EQ(mt::promote_types(p.b, p.a), p.expected) << mt::dtype_name(p.b) << " + " << mt::dtype_name(p.a);
  }
}

TEST(DTypePromotion, SymmetricAndIdempotent) {
  for (DType a : kAllDTypes) {
    EXPECT_EQ(mt::promote_types(a, a), a) << mt::dtype_name(a);
    for (DType b : kAllDTypes) {
      EXPECT_EQ(mt::promote_types(a, b), mt::promote_types(b, a)) << mt::dtype_name(a) << " + " << mt::dtype_name(b);
      if (mt::is_floating(a) && mt::is_integral(b)) EXPECT_EQ(mt::promote_types(a, b), a);
    }
  }
}

}  // namespace
