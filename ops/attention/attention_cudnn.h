// Fused (flash) attention through cuDNN's SDPA graphs (cudnn-frontend), forward and
// backward: O(T) memory instead of the reference's [B, H, Tq, Tk] scores. Internal to
// ops/attention; scaled_dot_product_attention() chooses it when cudnn_sdpa_unsupported()
// returns an empty reason.
//
//   q     // [B, H, Tq, D]    any strides with the last one 1 (e.g. a view of a [B, T, 3C] qkv)
//   k, v  // [B, Hkv, Tk, D]  Hkv divides H (grouped-query attention; dk, dv summed per group)
//   out   // [B, H, Tq, D]    contiguous when q is; else stored as [B, Tq, H, D], so merging
//         //                  the heads back is free (the gradients take q's, k's and v's layouts so)
//   stats // [B, H, Tq, 1]    f32 log-sum-exp of each row, for the backward
//   bias  // [B or 1, 1, Tq, Tk] contiguous, q's dtype, optional: added to the scaled scores
//         //                  (an attention mask: -inf where a query may not attend)
// Dropout draws from cuDNN's Philox with the caller's (seed, offset): the same pair in the
// backward (and in a checkpoint's recomputation) gives the same mask.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace mt::ops {

struct CudnnSdpaProblem {
  bool causal = false;
  double dropout_p = 0.0;
  double scale = 1.0;
  uint64_t seed = 0, offset = 0;  // dropout only
};

// Empty when the fused path can serve these inputs; otherwise why not (for the message
// printed once when falling back).
std::string cudnn_sdpa_unsupported(const Tensor& q, const Tensor& k, const Tensor& v);

struct CudnnSdpaForward {
  Tensor out;    // [B, H, Tq, D]
  Tensor stats;  // [B, H, Tq, 1] f32
};
CudnnSdpaForward cudnn_sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, const CudnnSdpaProblem& p,
                                    const Tensor& bias = Tensor());

// {dq, dk, dv}
std::array<Tensor, 3> cudnn_sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& grad_out, const Tensor& stats, const CudnnSdpaProblem& p,
                                          const Tensor& bias = Tensor());

}  // namespace mt::ops
