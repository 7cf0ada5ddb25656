// Random numbers: counter-based Philox4x32-10, the same stream on the CPU and on
// CUDA for the same (seed, offset).
//
// A draw of n numbers uses counters offset .. offset + ceil(n / 4) - 1, each
// giving four 32-bit words; element i takes word i % 4 of counter offset + i / 4.
// The generator's offset then advances by ceil(n / 4), so a replay (gradient
// checkpointing, dropout backward) only needs the (seed, offset) it started from.
//   uniform:  (word >> 8) * 2^-24, in [0, 1), exact in f32 (bitwise equal CPU/CUDA)
//   normal:   Box-Muller on word pairs (0,1) and (2,3) of a counter; equal CPU/CUDA
//             to a few ulps (their logf/cosf differ in the last bits).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dispatch.h"
#include "core/macros.h"
#include "core/tensor.h"

namespace mt {

namespace philox {

struct Words {
  uint32_t w[4];
};

MT_HOST_DEVICE inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
MT_HOST_DEVICE inline Words generate(uint64_t seed, uint64_t counter, uint64_t subsequence = 0) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Words{{c0, c1, c2, c3}};
}

MT_HOST_DEVICE inline float uniform(uint32_t word) { return static_cast<float>(word >> 8) * 5.9604644775390625e-8f; }

// The i-th uniform of a draw that starts at `offset`.
MT_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t offset, uint64_t i) {
  return uniform(generate(seed, offset + i / 4).w[i % 4]);
}

// The i-th standard normal of a draw that starts at `offset` (Box-Muller; u1 is
// moved off zero so the log stays finite).
MT_HOST_DEVICE inline float normal_at(uint64_t seed, uint64_t offset, uint64_t i) {
  const Words words = generate(seed, offset + i / 4);
  const uint32_t lane = static_cast<uint32_t>(i % 4);
  const float u1 = uniform(words.w[lane & 2u]) + 2.98023223876953125e-8f;  // + 2^-25: in (0, 1)
  const float u2 = uniform(words.w[(lane & 2u) | 1u]);
  const float radius = sqrtf(-2.0f * logf(u1));
  const float angle = 6.2831853071795864769f * u2;
  return (lane & 1u) ? radius * sinf(angle) : radius * cosf(angle);
}

// The representable value of T just below x (x finite).
template <typename T>
MT_HOST_DEVICE inline T next_below(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return ::nextafter(x, -HUGE_VAL);
  } else if constexpr (std::is_same_v<T, float>) {
    return ::nextafterf(x, -HUGE_VALF);
  } else {  // a NarrowFloat: step the sign-magnitude bits
    using Bits = typename T::Storage;
    constexpr Bits sign = static_cast<Bits>(Bits(1) << (8 * sizeof(Bits) - 1));
    if ((x.x & static_cast<Bits>(~sign)) == 0)
      return T::from_bits(static_cast<Bits>(sign | 1));  // +-0 -> -min subnormal
    return T::from_bits(static_cast<Bits>((x.x & sign) ? x.x + 1 : x.x - 1));
  }
}

// A uniform draw u in [0, 1) mapped to [low, high) in T. Rounding a + (b - a) u to
// a narrow type can land on `high`; such values step down to the largest T below it.
template <typename T>
MT_HOST_DEVICE inline T uniform_as(float u, double low, double high) {
  const T t = convert<T>(low + (high - low) * static_cast<double>(u));
  if (to_double(t) < high) return t;
  const T top = convert<T>(high);
  return to_double(top) < high ? top : next_below(top);
}

}  // namespace philox

// A generator's state: (seed, offset). One per device, plus any the user makes.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Reserves the counters for `n` numbers and returns the offset to start from.
  uint64_t advance(uint64_t n) {
    const uint64_t start = offset_;
    offset_ += (n + 3) / 4;
    return start;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator(Device device);
void manual_seed(uint64_t seed);  // seeds the CPU generator and every CUDA device's

Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* generator = nullptr);
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* generator = nullptr);
// Uniform in [low, high).
Tensor uniform(const Shape& shape, double low, double high, TensorOptions options = {}, Generator* generator = nullptr);

}  // namespace mt
