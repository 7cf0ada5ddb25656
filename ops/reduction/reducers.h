// The combine rules of the reductions, shared by the CPU and CUDA loops.
#pragma once

#include <limits>

#include "core/macros.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt::ops {

template <typename A>
MT_HOST_DEVICE inline A reduce_identity(ReduceKind kind) {
  return kind == ReduceKind::sum ? A(0) : -std::numeric_limits<A>::infinity();
}

template <typename A>
MT_HOST_DEVICE inline A reduce_combine(ReduceKind kind, A a, A b) {
  if (kind == ReduceKind::sum) return a + b;
  return (a > b || a != a) ? a : b;  // max; NaN propagates
}

// 1 where a == b, else 0: the positions of the maxima, for max's backward. A NaN maximum
// matches nothing, so its row's gradient is 0 / 0 = NaN everywhere, as torch.amax's is.
struct EqualMask {
  template <typename A>
  MT_HOST_DEVICE A operator()(A a, A b) const {
    return a == b ? A(1) : A(0);
  }
};

}  // namespace mt::ops
