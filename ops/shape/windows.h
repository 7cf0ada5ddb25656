// Gradients that arrive as windows of one buffer: the pieces of a split need no copy to
// be joined again when whoever made their gradients laid those out as the pieces are.
//
// In a transformer the fused qkv projection [B, T, 3C] is split into q, k and v. Attention's
// backward writes dq, dk and dv into one buffer laid out like the projection's output
// (empty_windows_like), and split's backward then returns that buffer as the projection's
// gradient (joined_view) instead of copying three gradients into a fresh one.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt::ops {

// True when a tensor of this shape and these (non-negative) strides reaches exactly numel
// consecutive storage slots: each once, none skipped (a contiguous layout, possibly permuted).
bool dense_layout(const Shape& shape, const Shape& strides);

// When `views` (two or more, one shape, dtype, device and strides) start at storage offsets a
// fixed step apart and together fill a dense block (the pieces of split(x, n, dim) of a
// contiguous x), fresh uninitialised tensors with the same layout in one new buffer. Otherwise
// an empty vector.
std::vector<Tensor> empty_windows_like(const std::vector<Tensor>& views);

// When `pieces` are consecutive windows along `dim`, starting at `starts`, of one dense tensor
// of `shape` (shared storage, equal strides, offsets where narrow() would put them) that they
// cover whole: that tensor, a view of their storage. Otherwise an undefined tensor. Pieces of
// length 0 are ignored and may be undefined.
Tensor joined_view(const std::vector<Tensor>& pieces, int64_t dim, const std::vector<int64_t>& starts,
                   const std::vector<int64_t>& lengths, const Shape& shape);

}  // namespace mt::ops
