// SwiGLU, the gated activation of Llama-family MLPs, in one pass each way:
//
//   y     = silu(gate) * up                         silu(g) = g * s, s = sigmoid(g)
//   dgate = dy * up * s * (1 + gate * (1 - s))
//   dup   = dy * silu(gate)
//
// gate and up share one shape, dtype and device (under autocast both come from projections in
// the autocast dtype); y has them too and is computed in f32 (f64 for f64) and rounded once.
// The backward reads dy, gate and up and writes both gradients in one pass; it saves gate and
// up, never y or silu(gate), so the MLP keeps two [N, I] activations where silu then mul keep four.
#pragma once

#include "core/tensor.h"

namespace mt {

Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace mt
