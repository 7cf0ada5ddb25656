// 16-byte packs for element-wise kernels over dense operands: each thread moves
// 16 bytes per load and store (one 128-bit access) and runs the element math in
// registers. The generic strided kernels compute every operand's offset with
// 64-bit divisions per element; on dense tensors that, and 2-byte accesses, left
// them at a fraction of the memory bandwidth.
#pragma once

#include <cstdint>

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

}  // namespace mt::cuda
