// Contracts of core/random.h on the CPU: the Philox4x32-10 block function
// against Random123's published answers, the documented stream layout (element
// i of a draw at offset o is word i % 4 of counter o + i / 4; the offset then
// advances by ceil(n / 4)), and the distributions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"

namespace {

using mt::DType;
using mt::Generator;
using mt::Tensor;

// ---- Philox4x32-10 known answers (Random123, kat_vectors: philox4x32 10 rounds) ----

struct PhiloxVector {
  const char* name;
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

class PhiloxKnownAnswerTest : public ::testing::TestWithParam<PhiloxVector> {};

TEST_P(PhiloxKnownAnswerTest, MatchesRandom123) {
  const PhiloxVector& v = GetParam();
  // generate(seed, counter, subsequence) packs key = (k0, k1), ctr = (c0, c1, c2, c3), low word first.
  const uint64_t seed = v.key[0] | (static_cast<uint64_t>(v.key[1]) << 32);
  const uint64_t counter = v.ctr[0] | (static_cast<uint64_t>(v.ctr[1]) << 32);
  const uint64_t subsequence = v.ctr[2] | (static_cast<uint64_t>(v.ctr[3]) << 32);
  const mt::philox::Words w = mt::philox::generate(seed, counter, subsequence);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(w.w[i], v.expected[i]) << "word " << i << ": got 0x" << std::hex << w.w[i] << ", expected 0x"
                                     << v.expected[i];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Random123, PhiloxKnownAnswerTest,
    ::testing::Values(PhiloxVector{"zeros", {0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
                      PhiloxVector{"all_ones",
                                   {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                   {0xffffffff, 0xffffffff},
                                   {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
                      PhiloxVector{"pi_digits",
                                   {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                                   {0xa4093822, 0x299f31d0},
                                   {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}),
    [](const ::testing::TestParamInfo<PhiloxVector>& info) { return std::string(info.param.name); });

// ---- the stream layout ----

// The documented uniform: the top 24 bits of a word, times 2^-24.
double uniform_from_word(uint32_t word) { return std::ldexp(static_cast<double>(word >> 8), -24); }

// 10 elements, and 100003 (drawn by several CPU tasks, the last group of four short).
TEST(RandomLayout, ElementIIsWordIMod4OfCounterOffsetPlusIDiv4) {
  for (const int64_t n : {int64_t{10}, int64_t{100003}}) {
    Generator gen(/*seed=*/1234);
    gen.set_offset(5);
    const std::vector<double> got = mt::rand({n}, DType::f64, &gen).to_vector<double>();
    for (uint64_t i = 0; i < got.size(); ++i) {
      const mt::philox::Words w = mt::philox::generate(1234, 5 + i / 4);
      ASSERT_EQ(got[i], uniform_from_word(w.w[i % 4])) << "element " << i << " of " << n;
    }
    EXPECT_EQ(gen.offset(), 5u + static_cast<uint64_t>((n + 3) / 4));
  }
}

// Box-Muller on word pairs (0, 1) and (2, 3): even lanes take the cosine, odd lanes the sine.
TEST(RandomLayout, NormalsUseBoxMullerOnWordPairs) {
  Generator gen(/*seed=*/99);
  const std::vector<double> got = mt::randn({12}, DType::f64, &gen).to_vector<double>();
  for (uint64_t i = 0; i < got.size(); ++i) {
    const mt::philox::Words w = mt::philox::generate(99, i / 4);
    const unsigned lane = static_cast<unsigned>(i % 4), pair = lane & 2u;
    // u1 is moved off zero by + 2^-25, in f32 as documented.
    const double u1 = static_cast<float>(uniform_from_word(w.w[pair])) + 2.98023223876953125e-8f;
    const double u2 = uniform_from_word(w.w[pair | 1u]);
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 6.283185307179586 * u2;
    const double expected = radius * ((lane & 1u) ? std::sin(angle) : std::cos(angle));
    EXPECT_NEAR(got[i], expected, 1e-5 * std::max(1.0, std::fabs(expected))) << "element " << i;
  }
}

TEST(RandomLayout, OffsetAdvancesByCeilNOver4) {
  Generator gen(/*seed=*/7);
  EXPECT_EQ(gen.seed(), 7u);
  EXPECT_EQ(gen.offset(), 0u);
  mt::rand({5}, {}, &gen);
  EXPECT_EQ(gen.offset(), 2u);
  mt::rand({2, 4}, {}, &gen);
  EXPECT_EQ(gen.offset(), 4u);
  mt::randn({1}, DType::f16, &gen);
  EXPECT_EQ(gen.offset(), 5u);
  mt::rand({0}, {}, &gen);
  EXPECT_EQ(gen.offset(), 5u);
  mt::uniform({3, 3}, -1.0, 1.0, DType::bf16, &gen);
  EXPECT_EQ(gen.offset(), 8u);
  EXPECT_EQ(gen.advance(9), 8u);
  EXPECT_EQ(gen.offset(), 11u);
  gen.manual_seed(3);
  EXPECT_EQ(gen.seed(), 3u);
  EXPECT_EQ(gen.offset(), 0u);
}

// Drawing n then m numbers continues the stream of one n + m draw only when n is
// a multiple of 4; otherwise the second draw starts at the next whole counter.
struct SplitCase {
  int64_t n, m;
};

class RandomSplitTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(RandomSplitTest, SecondDrawStartsAtTheNextWholeCounter) {
  const auto [n, m] = GetParam();
  Generator split(/*seed=*/42), whole(/*seed=*/42);
  const std::vector<float> first = mt::rand({n}, {}, &split).to_vector<float>();
  const std::vector<float> second = mt::rand({m}, {}, &split).to_vector<float>();
  const int64_t skip = (n + 3) / 4 * 4;  // where the second draw starts in one long draw
  const std::vector<float> all = mt::rand({skip + m}, {}, &whole).to_vector<float>();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(first[static_cast<size_t>(i)], all[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < m; ++i) EXPECT_EQ(second[static_cast<size_t>(i)], all[static_cast<size_t>(skip + i)]);
  if (n % 4 != 0) {
    // ...so it does NOT continue at element n: the words n .. skip - 1 are never used.
    EXPECT_NE(second[0], all[static_cast<size_t>(n)]);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, RandomSplitTest,
                         ::testing::Values(SplitCase{8, 6}, SplitCase{4, 1}, SplitCase{5, 7}, SplitCase{1, 4},
                                           SplitCase{7, 9}, SplitCase{1001, 3}),
                         [](const ::testing::TestParamInfo<SplitCase>& info) {
                           return "n" + std::to_string(info.param.n) + "_m" + std::to_string(info.param.m);
                         });

TEST(RandomSeeding, ManualSeedMakesDrawsRepeat) {
  mt::manual_seed(2024);
  const std::vector<float> a = mt::rand({1000}).to_vector<float>();
  const std::vector<float> an = mt::randn({1000}).to_vector<float>();
  mt::manual_seed(2024);
  EXPECT_EQ(mt::default_generator(mt::kCPU).offset(), 0u);
  EXPECT_EQ(mt::default_generator(mt::kCPU).seed(), 2024u);
  EXPECT_EQ(mt::rand({1000}).to_vector<float>(), a);
  EXPECT_EQ(mt::randn({1000}).to_vector<float>(), an);
  EXPECT_NE(mt::rand({1000}).to_vector<float>(), a) << "the stream moved on";
  mt::manual_seed(2025);
  EXPECT_NE(mt::rand({1000}).to_vector<float>(), a) << "another seed, another stream";
}

TEST(RandomSeeding, ExplicitGeneratorLeavesTheDefaultAlone) {
  mt::manual_seed(1);
  Generator gen(/*seed=*/1);
  const std::vector<float> mine = mt::rand({100}, {}, &gen).to_vector<float>();
  EXPECT_EQ(mt::default_generator(mt::kCPU).offset(), 0u);
  EXPECT_EQ(mt::rand({100}).to_vector<float>(), mine) << "same (seed, offset), same numbers";
}

// ---- distributions, per floating dtype ----

class RandomDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(RandomDTypeTest, UniformValuesAreInZeroOne) {
  Generator gen(/*seed=*/5);
  const Tensor t = mt::rand({1 << 16}, GetParam(), &gen);
  EXPECT_EQ(t.dtype(), GetParam());
  const std::vector<double> v = t.to_vector<double>();
  int64_t outside = 0;
  double lo = 1, hi = 0;
  for (double x : v) {
    outside += !(x >= 0.0 && x < 1.0);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_EQ(outside, 0) << "of " << v.size() << " values; min " << lo << ", max " << hi;
  EXPECT_LT(lo, 0.01);
  EXPECT_GT(hi, 0.99);
}

TEST_P(RandomDTypeTest, UniformLowHighStaysInRange) {
  Generator gen(/*seed=*/6);
  const std::vector<double> v = mt::uniform({1 << 14}, -2.0, 3.0, GetParam(), &gen).to_vector<double>();
  for (double x : v)
    ASSERT_TRUE(x >= -2.0 && x < 3.0) << "uniform(-2, 3) in " << mt::dtype_name(GetParam()) << " gave " << x;
}

INSTANTIATE_TEST_SUITE_P(Floating, RandomDTypeTest, ::testing::Values(DType::f64, DType::f32, DType::f16, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& info) { return mt::dtype_name(info.param); });

// Seed 42, counter 3135530: word 0 is 0xffffff23, whose top 24 bits are all ones,
// so the exact uniform is 1 - 2^-24: the largest value a draw can produce.
constexpr uint64_t kSeedNearOne = 42, kCounterNearOne = 3135530;

TEST(RandomEdges, LargestUniformStaysBelowOneInEveryDType) {
  ASSERT_EQ(mt::philox::generate(kSeedNearOne, kCounterNearOne).w[0] >> 8, 0xffffffu);
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    Generator gen(kSeedNearOne);
    gen.set_offset(kCounterNearOne);
    const double x = mt::rand({4}, dtype, &gen).to_vector<double>()[0];
    EXPECT_LT(x, 1.0) << "rand in " << mt::dtype_name(dtype) << " returned " << x << " for the largest word";
  }
}

TEST(RandomEdges, LargestUniformStaysBelowHigh) {
  for (DType dtype : {DType::f64, DType::f32}) {
    Generator gen(kSeedNearOne);
    gen.set_offset(kCounterNearOne);
    const double x = mt::uniform({4}, 1.0, 2.0, dtype, &gen).to_vector<double>()[0];
    EXPECT_LT(x, 2.0) << "uniform(1, 2) in " << mt::dtype_name(dtype) << " returned " << x;
  }
}

TEST(RandomMoments, OneMillionNormals) {
  Generator gen(/*seed=*/31337);
  const std::vector<float> v = mt::randn({1000000}, {}, &gen).to_vector<float>();
  double sum = 0, sum_sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(v.size()), mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
}

TEST(RandomMoments, OneMillionUniforms) {
  Generator gen(/*seed=*/271828);
  const std::vector<float> v = mt::rand({1000000}, {}, &gen).to_vector<float>();
  double sum = 0, sum_sq = 0;
  for (float x : v) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(v.size()), mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(var, 1.0 / 12, 0.005);
}

TEST(RandomErrors, NonFloatingDTypesThrow) {
  for (DType dtype : {DType::i64, DType::i32, DType::u8, DType::boolean, DType::f8e4m3, DType::f8e5m2}) {
    try {
      mt::rand({4}, dtype);
      ADD_FAILURE() << "rand accepted " << mt::dtype_name(dtype);
    } catch (const mt::DTypeError& e) {
      EXPECT_NE(std::string(e.what()).find(mt::dtype_name(dtype)), std::string::npos) << e.what();
    }
    EXPECT_THROW(mt::randn({4}, dtype), mt::DTypeError);
  }
  EXPECT_THROW(mt::uniform({4}, 1.0, 1.0), mt::Error);
}

}  // namespace
