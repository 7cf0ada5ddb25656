// Scaled dot-product attention, the reference (unfused) implementation.
//
//   q   // [B, H, Tq, D]
//   k   // [B, H, Tk, D]
//   v   // [B, H, Tk, Dv]
//   out // [B, H, Tq, Dv]
//   scores = (q k^T) * scale                 // [B, H, Tq, Tk], scale defaults to 1 / sqrt(D)
//   causal: scores[..., i, j] = -inf for j > i (top-left aligned, as PyTorch's
//           is_causal: query i attends keys 0..i; with Tq > Tk the extra rows see every key)
//   attn = softmax(scores, -1), then dropout(attn, dropout_p) when dropout_p > 0
//          (always applied when asked: there is no training flag, as in PyTorch)
//   out = attn v
//
// Composed of differentiable ops (matmul, masked_fill, softmax, dropout), so it
// needs no backward of its own and materialises the [B, H, Tq, Tk] scores. It
// runs in the inputs' dtype: matmul accumulates in f32 and softmax upcasts
// internally. q, k and v must share one dtype and one device.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace mt {

Tensor scaled_dot_product_attention(const Tensor& q /*[B, H, Tq, D]*/, const Tensor& k /*[B, H, Tk, D]*/,
                                    const Tensor& v /*[B, H, Tk, Dv]*/, bool causal = false, double dropout_p = 0.0,
                                    std::optional<double> scale = std::nullopt);  // -> [B, H, Tq, Dv]

}  // namespace mt
