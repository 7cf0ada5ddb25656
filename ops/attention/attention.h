// Scaled dot-product attention: cuDNN flash attention on the GPU, a reference composite elsewhere.
//
//   q   // [B, H, Tq, D]
//   k   // [B, Hkv, Tk, D]   Hkv divides H: grouped-query attention, query head h reading
//   v   // [B, Hkv, Tk, Dv]  key/value head h / (H / Hkv); Hkv = H is multi-head attention
//   out // [B, H, Tq, Dv]
//   scores = (q k^T) * scale                 // [B, H, Tq, Tk], scale defaults to 1 / sqrt(D)
//   causal: scores[..., i, j] = -inf for j > i (top-left aligned, as PyTorch's
//           is_causal: query i attends keys 0..i; with Tq > Tk the extra rows see every key)
//   attn_mask (optional) // [B or 1, 1, Tq, Tk], as PyTorch's: bool (true: may attend; false: the score
//           becomes -inf) or floating (added to the scores). Packed sequences pass
//           document_mask(segments) so that attention never crosses from one example into another.
//           A row that may attend nothing is NaN, as in PyTorch.
//   attn = softmax(scores, -1), then dropout(attn, dropout_p) when dropout_p > 0
//          (always applied when asked: there is no training flag, as in PyTorch)
//   out = attn v
//
// On CUDA, for f16/bf16 with head size D = Dv a multiple of 8 up to 128 (sm_80 and newer),
// it runs cuDNN's fused flash attention (ops/attention/attention_cudnn.h): O(T) memory, the
// scores never stored, k and v read by each group of query heads (never repeated in memory),
// a mask given to cuDNN as an additive bias in the inputs' dtype, dropout drawn by cuDNN's Philox from the device
// generator's (seed, offset). Otherwise (the CPU, f32/f64, other head sizes) it runs the reference composite of
// differentiable ops (matmul, masked_fill, softmax, dropout), which materialises the [B, H, Tq, Tk] scores; on a GPU
// that fallback prints a warning once per reason. Both run in the inputs' dtype, accumulating in f32. q, k and v must
// share one dtype and one device. A single query row (Tq = 1, a cached generation step) always takes the composite: its
// scores are one row per head, and the grouped heads then share k and v without a copy.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace mt {

Tensor scaled_dot_product_attention(const Tensor& q /*[B, H, Tq, D]*/, const Tensor& k /*[B, Hkv, Tk, D]*/,
                                    const Tensor& v /*[B, Hkv, Tk, Dv]*/, bool causal = false, double dropout_p = 0.0,
                                    std::optional<double> scale = std::nullopt,
                                    const Tensor& attn_mask = Tensor());  // -> [B, H, Tq, Dv]

// The attention mask of packed sequences: segments [B, T] integer ids (the tokens of one example
// share an id) -> bool [B, 1, T, T], true where segments[b, i] == segments[b, j]. With causal
// attention, each token then sees the tokens before it in its own example only.
Tensor document_mask(const Tensor& segments);

// attn_mask in the additive form attention uses: a bool mask's false entries -inf and true ones 0,
// a floating mask's values, in `dtype`, contiguous. Made once, it serves every layer of a pass.
Tensor attention_bias(const Tensor& attn_mask, DType dtype);

}  // namespace mt
