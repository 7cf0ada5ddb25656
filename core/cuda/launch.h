// Launch-shape helpers shared by our element-wise kernels.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mt::cuda {

constexpr int kBlockSize = 256;

// Enough blocks to cover n elements with one thread each, capped so grid-stride
// loops take over for huge tensors (a few waves on any current GPU).
inline unsigned grid_for(int64_t n, int block = kBlockSize) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 132 * 32));
}

}  // namespace mt::cuda
