// Internal: SwiGLU's loops (ops/elementwise/swiglu.h). Every tensor is contiguous, of one
// shape and dtype.
#pragma once

#include "core/dispatch.h"
#include "core/macros.h"
#include "core/tensor.h"
#include "ops/math.h"

namespace mt::ops {

// The per-element formulas both devices share.
struct SwigluMath {
  template <typename A>
  MT_HOST_DEVICE static A forward(A gate, A up) {
    return gate / (A(1) + math::exp(-gate)) * up;
  }
  // {dgate, dup}
  template <typename A>
  MT_HOST_DEVICE static void backward(A dy, A gate, A up, A* dgate, A* dup) {
    const A s = A(1) / (A(1) + math::exp(-gate));
    *dgate = dy * up * s * (A(1) + gate * (A(1) - s));
    *dup = dy * gate * s;
  }
};

void swiglu_forward_cpu(const Tensor& out, const Tensor& gate, const Tensor& up);
void swiglu_backward_cpu(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                         const Tensor& up);
void swiglu_forward_cuda(const Tensor& out, const Tensor& gate, const Tensor& up);
void swiglu_backward_cuda(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                          const Tensor& up);

}  // namespace mt::ops
