// 16-byte packs for element-wise kernels over dense operands: each thread moves
// 16 bytes per load and store (one 128-bit access) and runs the element math in
// registers. The generic strided kernels compute every operand's offset with
// 64-bit divisions per element; on dense tensors that, and 2-byte accesses, left
// them at a fraction of the memory bandwidth.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dispatch.h"
#include "core/float_types.h"

namespace mt::cuda {

// Elements per 16-byte pack: 8 for f16/bf16, 4 for f32, 2 for f64.
template <typename T>
constexpr int pack_size() {
  return sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Whether p can be read or written as packs of `bytes` bytes.
inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// body(pack index) for every whole pack of N elements out of n, then tail(element
// index) for the last n % N elements; grid-stride over both.
template <int N, typename Body, typename Tail>
__device__ __forceinline__ void for_each_pack(int64_t n, Body&& body, Tail&& tail) {
  const int64_t packs = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < packs; i += stride) body(i);
  for (int64_t i = packs * N + first; i < n; i += stride) tail(i);
}

// ---- packs of accumulation values in registers (A: f32, or f64 beside f64 data), read from and
// written as E ----
// The bits are those of convert<> element by element (Note [Conversion rule]); what differs is
// the instruction count, which bounds the row kernels (converting one bf16 at a time costs tens of
// integer instructions per element).

// kN elements at p (aligned to the pack) as A. A bf16 is the top half of its f32: one shift or
// mask per element.
template <int kN, typename E, typename A>
__device__ __forceinline__ void load_pack_as(const E* __restrict__ p, A* out) {
  if constexpr (std::is_same_v<E, BFloat16> && std::is_same_v<A, float> && kN % 2 == 0) {
    const Pack<uint32_t, kN / 2> words = *reinterpret_cast<const Pack<uint32_t, kN / 2>*>(p);
#pragma unroll
    for (int k = 0; k < kN / 2; ++k) {
      out[2 * k] = __uint_as_float(words.v[k] << 16);
      out[2 * k + 1] = __uint_as_float(words.v[k] & 0xffff0000u);
    }
  } else {
    const Pack<E, kN> pack = *reinterpret_cast<const Pack<E, kN>*>(p);
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = convert<A>(pack.v[i]);
  }
}

// From f32 to a half type, two values per instruction through the paired conversion (sm_80 on:
// cvt.rn.{bf16,f16}x2.f32, rounding to nearest even with overflow to inf and exact subnormals,
// the rule's bits), unless a value is a NaN: the rule keeps a NaN's payload, which that
// instruction does not, so packs with one convert element by element.
template <typename E, typename A, int kN>
constexpr bool kPairedConversion =
    (std::is_same_v<E, BFloat16> || std::is_same_v<E, Half>)&&std::is_same_v<A, float>&& kN % 2 == 0;

// Whether in[0, kN) may take the paired conversion to E: kPairedConversion, on sm_80 or later, and
// no NaN among them.
template <int kN, typename E, typename A>
__device__ __forceinline__ bool pairs_convertible(const A* in) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kPairedConversion<E, A, kN>) {
    bool nan = false;
#pragma unroll
    for (int i = 0; i < kN; ++i) nan |= in[i] != in[i];
    return !nan;
  }
#endif
  (void)in;
  return false;
}

// in[0, kN) as kN / 2 words of E pairs, the first of each pair in the lower half; only for values
// pairs_convertible allows.
template <int kN, typename E, typename A>
__device__ __forceinline__ void convert_pairs(const A* in, uint32_t* words) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kPairedConversion<E, A, kN>) {
#pragma unroll
    for (int k = 0; k < kN / 2; ++k) {  // the instruction's first operand goes to the upper half
      if constexpr (std::is_same_v<E, BFloat16>) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(words[k]) : "f"(in[2 * k + 1]), "f"(in[2 * k]));
      } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(words[k]) : "f"(in[2 * k + 1]), "f"(in[2 * k]));
      }
    }
  }
#endif
  (void)in, (void)words;
}

// kN values written as E at p (aligned to the pack): paired where pairs_convertible allows, else
// element by element.
template <int kN, typename E, typename A>
__device__ __forceinline__ void store_pack_from(E* __restrict__ p, const A* in) {
  if constexpr (kPairedConversion<E, A, kN>) {
    if (pairs_convertible<kN, E>(in)) {
      Pack<uint32_t, kN / 2> words;
      convert_pairs<kN, E>(in, words.v);
      *reinterpret_cast<Pack<uint32_t, kN / 2>*>(p) = words;
      return;
    }
  }
  Pack<E, kN> pack;
#pragma unroll
  for (int i = 0; i < kN; ++i) pack.v[i] = convert<E>(in[i]);
  *reinterpret_cast<Pack<E, kN>*>(p) = pack;
}

}  // namespace mt::cuda
