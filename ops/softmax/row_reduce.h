// Combine rules for the row-wise reductions of the softmax, loss and norm
// families, compiled for host and device so the CPU and CUDA kernels reduce with
// one formula. (Used by ops/loss and ops/norm too; a candidate for ops/cuda/.)
#pragma once

#include <limits>

#include "core/macros.h"

namespace mt::ops::rowwise {

struct Sum {
  template <typename A>
  MT_HOST_DEVICE static A identity() {
    return A(0);
  }
  template <typename A>
  MT_HOST_DEVICE A operator()(A a, A b) const {
    return a + b;
  }
};

// NaN propagates: a row holding a NaN has a NaN maximum (and so a NaN softmax).
struct Max {
  template <typename A>
  MT_HOST_DEVICE static A identity() {
    return -std::numeric_limits<A>::infinity();
  }
  template <typename A>
  MT_HOST_DEVICE A operator()(A a, A b) const {
    return (a > b || a != a) ? a : b;
  }
};

}  // namespace mt::ops::rowwise
