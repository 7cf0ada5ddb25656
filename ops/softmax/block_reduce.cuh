// Warp- and block-wide reductions for kernels that give one block to one row
// (softmax, cross-entropy, layer/RMS norm). blockDim.x must be a multiple of 32
// and at most 1024, blockDim.y == blockDim.z == 1. Every thread of the block
// must call block_reduce (it synchronises), and every thread gets the result.
#pragma once

#include "ops/softmax/row_reduce.h"

namespace mt::ops::rowwise {

constexpr int kWarpSize = 32;

template <typename A, typename Combine>
__device__ inline A warp_reduce(A v, Combine combine) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// `scratch` is __shared__ storage for kWarpSize values of A. The first barrier
// keeps a warp from overwriting scratch while another still reads the previous
// call's values, so consecutive calls may share one scratch array.
template <typename A, typename Combine>
__device__ inline A block_reduce(A v, Combine combine, A* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = warp_reduce(v, combine);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : Combine::template identity<A>();
  return warp_reduce(v, combine);
}

// Threads for one row of `cols` elements: about kElementsPerThread each (fewer
// warps make the block reductions cheaper), a multiple of the warp size, between
// one warp and `max_threads`.
inline int row_block_threads(int64_t cols, int max_threads = 512) {
  constexpr int64_t kElementsPerThread = 8;
  const int64_t wanted = (cols + kElementsPerThread - 1) / kElementsPerThread;
  const int64_t rounded = (wanted + kWarpSize - 1) / kWarpSize * kWarpSize;
  return static_cast<int>(rounded < kWarpSize ? kWarpSize : (rounded > max_threads ? max_threads : rounded));
}

// Blocks for `rows` rows, one per row; kernels loop over rows for the rest.
inline unsigned row_grid(int64_t rows) {
  constexpr int64_t kMaxBlocks = 1 << 16;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > kMaxBlocks ? kMaxBlocks : rows));
}

}  // namespace mt::ops::rowwise
