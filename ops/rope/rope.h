// Rotary position embeddings (RoPE) as Llama-family models apply them (Hugging Face's
// rotate_half form), in one pass over q or k in the attention layout:
//
//   x        // [B, H, T, D]  any strides with the last one 1 (the heads view of a projection)
//   inv_freq // [D/2] f32 on x's device: 1 / theta^(2i / D), rescaled as the config says
//   angle[t, i] = f32(start + t) * inv_freq[i]   (an f32 product, as transformers forms it)
//   y[..., t, i]       = x[..., t, i] cos(angle) - x[..., t, i + D/2] sin(angle)
//   y[..., t, i + D/2] = x[..., t, i + D/2] cos(angle) + x[..., t, i] sin(angle)
//
// The cosines and sines are computed in registers from the angle, never stored: no [T, D]
// tables per step. `start` is the position of row t = 0 (a cached generation step's
// positions follow the cache). y has x's dtype and layout ([B, T, H, D] storage when x is a
// projection's heads), and is computed in f32 (f64 for f64 inputs) and rounded once.
// Backward: the rotation by -angle, nothing saved.
//
// Packed sequences (several examples in one row) give each row its own positions instead:
//   positions // [B, T] i64 on x's device, each >= 0: angle[b, t, i] = f32(positions[b, t]) * inv_freq[i]
// (values are not checked on the device; the packing that makes them does).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt {

Tensor rope(const Tensor& x, const Tensor& inv_freq, int64_t start = 0);
Tensor rope(const Tensor& x, const Tensor& inv_freq, const Tensor& positions);

}  // namespace mt
