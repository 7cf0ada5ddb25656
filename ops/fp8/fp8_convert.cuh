// Internal: the device-side FP8 conversions the CUDA cast kernels share (fp8_cuda.cu,
// fp8_rowwise_cuda.cu), so that every kernel writes the same bits as the CPU reference.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/fp8/fp8_kernels.h"

namespace mt::ops {

// Two values as Format's bits (lo in the low byte), by Note [Conversion rule]. On sm_89 and later
// one cvt.rn.satfinite instruction converts both: round to nearest even, finite overflow and
// infinities to +-max, subnormals kept: the rule's bits, except for NaN, whose sign and payload it
// does not keep; a NaN takes the software conversion.
template <typename Format>
__device__ __forceinline__ uint32_t fp8_pair(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t pair;  // the instruction's first source goes to the upper byte
  if constexpr (std::is_same_v<Format, F8E4M3Format>) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  }
  uint32_t lo_bits = pair & 0xffu, hi_bits = pair >> 8;
  if (lo != lo) lo_bits = Format::from_f32(lo);
  if (hi != hi) hi_bits = Format::from_f32(hi);
  return lo_bits | (hi_bits << 8);
#else
  return Format::from_f32(lo) | (static_cast<uint32_t>(Format::from_f32(hi)) << 8);
#endif
}

// v[0, 4) * scale (scaled(): the same NaN as on the CPU) as four FP8 bytes in one word, v[0] lowest.
template <typename Format>
__device__ __forceinline__ uint32_t fp8_word(const float* v, float scale) {
  return fp8_pair<Format>(scaled(v[0], scale), scaled(v[1], scale)) |
         (fp8_pair<Format>(scaled(v[2], scale), scaled(v[3], scale)) << 16);
}

}  // namespace mt::ops
