// Internal: the rotation loop of ops/rope/rope.h, forward (sign +1) and backward (sign -1, the
// inverse rotation). out and in are [B, H, T, D] with any strides whose last is 1.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

struct RopeRotation {
  int64_t start = 0;  // position of row t = 0
  int sign = 1;       // +1: rotate by angle; -1: by -angle (the backward)
  // [B, T] contiguous, on in's device: row (b, t)'s position, instead of start + t (packed sequences)
  const int64_t* positions = nullptr;
};

void rope_cpu(const Tensor& out, const Tensor& in, const Tensor& inv_freq, const RopeRotation& rotation);
void rope_cuda(const Tensor& out, const Tensor& in, const Tensor& inv_freq, const RopeRotation& rotation);

}  // namespace mt::ops
