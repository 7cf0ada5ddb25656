// Internal: the dropout mask-and-scale loop, used by forward (on x) and by
// backward (on dy) with the same (seed, offset). Element i (row-major index over
// `in`'s shape) is kept iff philox::uniform_at(seed, offset, i) >= p, and kept
// values are multiplied by `scale`. out is contiguous with in's shape; in may be strided.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

struct DropoutMask {
  uint64_t seed = 0;
  uint64_t offset = 0;  // Philox counter the draw starts at
  double p = 0.0;       // drop probability
  double scale = 1.0;   // 1 / (1 - p)
};

void dropout_cpu(const Tensor& out, const Tensor& in, const DropoutMask& mask);
void dropout_cuda(const Tensor& out, const Tensor& in, const DropoutMask& mask);

}  // namespace mt::ops
