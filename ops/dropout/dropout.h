// Dropout with a counter-based mask (Philox, core/random.h).
//
//   x   // [...] floating
//   out // [...] out[i] = x[i] * (keep(i) ? 1 / (1 - p) : 0),
//                keep(i) = philox::uniform_at(seed, offset, i) >= p,
//   a product, as in PyTorch, so a dropped NaN or inf still gives NaN rather than vanishing;
//   where i is the element's row-major (logical) index, whatever x's strides.
//
// The (seed, offset) come from `generator` (default: default_generator(x.device())),
// whose offset advances by ceil(numel / 4) counters. The node saves only (seed,
// offset, p): backward recomputes the mask instead of storing it, and CPU and
// CUDA draw the same mask for the same (seed, offset), so a replay (gradient
// checkpointing) reproduces it exactly.
//
// p = 0 or training = false returns x itself (no node, no draw); p = 1 returns
// zeros (gradient zero, no draw); p outside [0, 1] throws.
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace mt {

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator = nullptr);

}  // namespace mt
