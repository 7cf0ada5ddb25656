// Narrow floating-point storage types and their conversions to and from f32.
//
// Note [Conversion rule]
// Every conversion from f32 to a narrower type rounds to nearest, ties to even,
// on the infinitely precise value, and handles the edges the same way on the
// CPU and in CUDA kernels (these functions are compiled for both, so the two
// agree bit for bit):
//   f16, bf16      overflow rounds to +-inf as IEEE 754 says.
//   f8e4m3 (fn)    no infinities: anything whose rounded magnitude exceeds 448,
//                  +-inf included, saturates to +-448 (0x7e / 0xfe).
//   f8e5m2         likewise saturates to +-57344 (0x7b / 0xfb), +-inf included.
//                  Saturation is what fp8 training recipes want: a scaled value
//                  that overflows by a hair should clip, not become inf/NaN.
//   NaN            stays NaN with its sign; as much of its payload as fits is
//                  kept, and a payload that would vanish becomes the quiet bit,
//                  so every f16/bf16/f8 bit pattern round-trips through f32.
//   subnormals     are produced and read exactly (no flush to zero).
// Conversions from f64 go through f32 (one extra rounding; documented, rare).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/macros.h"

namespace mt {
namespace bits {

MT_HOST_DEVICE inline uint32_t f32_to_u32(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MT_HOST_DEVICE inline float u32_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Rounds the 24-bit significand `m` (implicit bit set) right by `shift` bits,
// ties to even. Used for every subnormal result.
MT_HOST_DEVICE inline uint32_t shift_right_rne(uint32_t m, uint32_t shift) {
  if (shift >= 32) return 0;
  const uint32_t kept = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// Rounds a normal f32 (as bits, sign cleared) to `man_bits` of mantissa, ties to
// even, and rebiases its exponent by `rebias` (127 - target bias). Returns the
// target encoding without sign; the caller handles overflow beforehand.
MT_HOST_DEVICE inline uint32_t round_normal(uint32_t abs, int man_bits, uint32_t rebias) {
  const uint32_t drop = 23u - static_cast<uint32_t>(man_bits);
  const uint32_t lsb = (abs >> drop) & 1u;
  const uint32_t rounded = abs + ((1u << (drop - 1u)) - 1u) + lsb;
  return (rounded - (rebias << 23)) >> drop;
}

// A subnormal (or underflowing) f32 magnitude `abs` expressed in units of
// 2^min_subnormal_exp, rounded to nearest even.
MT_HOST_DEVICE inline uint32_t round_subnormal(uint32_t abs, int min_subnormal_exp) {
  const uint32_t exp = abs >> 23;
  if (exp == 0) return 0;  // f32 subnormals are far below every target's range
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  // value = m * 2^(exp - 150); in target units: m * 2^(exp - 150 - min_subnormal_exp)
  const int shift = 150 + min_subnormal_exp - static_cast<int>(exp);
  if (shift <= 0) return m << (-shift);  // not reached for the callers' ranges
  return shift_right_rne(m, static_cast<uint32_t>(shift));
}

// In CUDA kernels the f16 and bf16 conversions of every number but NaN are one cvt instruction:
// the hardware rounds to nearest even, overflows to inf and keeps subnormals exactly as the
// software rule above does, so the results are the same bits; NaN takes the software path, which
// keeps its payload. The software conversion alone is some twenty integer instructions and
// branches per element, enough to bound a kernel that converts every element it reads.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MT_HARDWARE_HALF_CONVERSIONS 1
#endif

MT_HOST_DEVICE inline bool f32_bits_are_nan(uint32_t x) { return (x & 0x7fffffffu) > 0x7f800000u; }

// ---- f16 (IEEE binary16: 1-5-10, bias 15) ----
MT_HOST_DEVICE inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_to_u32(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  const uint32_t payload = (abs >> 13) & 0x3ffu;
  const uint16_t nan = static_cast<uint16_t>(sign | 0x7c00u | (payload ? payload : 0x200u));
#if defined(MT_HARDWARE_HALF_CONVERSIONS)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return abs > 0x7f800000u ? nan : h;  // a select, not a branch
#else
  if (abs > 0x7f800000u) return nan;
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {                                               // below 2^-14: subnormal
    return static_cast<uint16_t>(sign | round_subnormal(abs, -24));
  }
  return static_cast<uint16_t>(sign | round_normal(abs, 10, 112));
#endif
}

MT_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
#if defined(MT_HARDWARE_HALF_CONVERSIONS)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return exp == 0x1f && man != 0 ? u32_to_f32(sign | 0x7f800000u | (man << 13)) : f;  // NaN: its payload
#else
  if (exp == 0x1f) return u32_to_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return u32_to_f32(sign);
    uint32_t e = 113;  // exponent field of 2^-14
    while (!(man & 0x400u)) {
      man <<= 1;
      --e;
    }
    return u32_to_f32(sign | (e << 23) | ((man & 0x3ffu) << 13));
  }
  return u32_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
#endif
}

// ---- bf16 (1-8-7, the top half of an f32) ----
MT_HOST_DEVICE inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_to_u32(f);
  const uint32_t top = x >> 16;
  const uint16_t nan = static_cast<uint16_t>((top & 0x7fu) ? top : (top | 0x40u));
#if defined(MT_HARDWARE_HALF_CONVERSIONS)
  uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return f32_bits_are_nan(x) ? nan : b;  // a select, not a branch
#else
  if (f32_bits_are_nan(x)) return nan;
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}

MT_HOST_DEVICE inline float bf16_to_f32(uint16_t b) { return u32_to_f32(static_cast<uint32_t>(b) << 16); }

// ---- f8e4m3fn (1-4-3, bias 7, max 448, NaN = S.1111.111, no inf) ----
MT_HOST_DEVICE inline uint8_t f32_to_f8e4m3(float f) {
  const uint32_t x = f32_to_u32(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (abs >= 0x43e80000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 464 (ties to even 448), inf
  if (abs < 0x3c800000u) return static_cast<uint8_t>(sign | round_subnormal(abs, -9));  // < 2^-6
  return static_cast<uint8_t>(sign | round_normal(abs, 3, 120));
}

MT_HOST_DEVICE inline float f8e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  if (exp == 0xf && man == 0x7) return u32_to_f32(sign | 0x7fc00000u);
  if (exp == 0) {
    const float v = static_cast<float>(man) * 0.001953125f;  // man * 2^-9, exact
    return sign ? -v : v;
  }
  return u32_to_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

// ---- f8e5m2 (1-5-2, bias 15, max 57344, has inf; the top byte of an f16) ----
MT_HOST_DEVICE inline uint8_t f32_to_f8e5m2(float f) {
  const uint32_t x = f32_to_u32(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    const uint32_t payload = (abs >> 21) & 0x3u;
    return static_cast<uint8_t>(sign | 0x7cu | (payload ? payload : 0x2u));
  }
  if (abs >= 0x47700000u) return static_cast<uint8_t>(sign | 0x7bu);  // >= 61440 (ties away from odd max), inf
  if (abs < 0x38800000u) return static_cast<uint8_t>(sign | round_subnormal(abs, -16));  // < 2^-14
  return static_cast<uint8_t>(sign | round_normal(abs, 2, 112));
}

MT_HOST_DEVICE inline float f8e5m2_to_f32(uint8_t b) { return f16_to_f32(static_cast<uint16_t>(b) << 8); }

}  // namespace bits

// Storage types: one per narrow format, holding the raw bits. Arithmetic is done
// by converting to float; these types exist so that templates can tell the
// formats apart and so that a tensor's bytes are exactly the format's bits.
template <typename Format>
struct NarrowFloat {
  using Storage = typename Format::Storage;
  Storage x = 0;

  NarrowFloat() = default;
  MT_HOST_DEVICE explicit NarrowFloat(float f) : x(Format::from_f32(f)) {}
  MT_HOST_DEVICE explicit operator float() const { return Format::to_f32(x); }
  MT_HOST_DEVICE static NarrowFloat from_bits(Storage b) {
    NarrowFloat n;
    n.x = b;
    return n;
  }
};

struct F16Format {
  using Storage = uint16_t;
  MT_HOST_DEVICE static float to_f32(Storage b) { return bits::f16_to_f32(b); }
  MT_HOST_DEVICE static Storage from_f32(float f) { return bits::f32_to_f16(f); }
};
struct BF16Format {
  using Storage = uint16_t;
  MT_HOST_DEVICE static float to_f32(Storage b) { return bits::bf16_to_f32(b); }
  MT_HOST_DEVICE static Storage from_f32(float f) { return bits::f32_to_bf16(f); }
};
struct F8E4M3Format {
  using Storage = uint8_t;
  MT_HOST_DEVICE static float to_f32(Storage b) { return bits::f8e4m3_to_f32(b); }
  MT_HOST_DEVICE static Storage from_f32(float f) { return bits::f32_to_f8e4m3(f); }
};
struct F8E5M2Format {
  using Storage = uint8_t;
  MT_HOST_DEVICE static float to_f32(Storage b) { return bits::f8e5m2_to_f32(b); }
  MT_HOST_DEVICE static Storage from_f32(float f) { return bits::f32_to_f8e5m2(f); }
};

using Half = NarrowFloat<F16Format>;
using BFloat16 = NarrowFloat<BF16Format>;
using Float8E4M3 = NarrowFloat<F8E4M3Format>;
using Float8E5M2 = NarrowFloat<F8E5M2Format>;
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit formats must be exactly their bits");
static_assert(sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1, "8-bit formats must be exactly their bits");

}  // namespace mt
