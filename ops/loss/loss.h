// Losses. Every loss is computed and returned in f32 for f32/f16/bf16 inputs
// (f64 for f64): the autocast policy runs every loss in fp32, and this keeps a
// half-precision model's loss and its gradient scale exact enough to log and to
// scale. The gradient reaching the logits has the logits' dtype.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt {

enum class Reduction {
  mean,  // over the rows that are not ignored
  sum,
  none  // one loss per row, shaped like the target
};

// Cross-entropy with class indices, as torch.nn.functional.cross_entropy:
//   logits [N, C] with target [N], or logits [N, C, d1, ...] with target [N, d1, ...]
//   (the class dim is dim 1); target dtype i64 or i32.
//   loss_i = logsumexp(logits_i) - logits_i[target_i]   (fp32/f64 accumulation)
//   ignore_index: rows whose target equals it contribute 0 and have a zero
//   gradient; `mean` divides by the number of rows that are NOT ignored, so
//   when every row is ignored the mean is 0/0 = NaN, as in PyTorch.
// Returns a scalar (mean, sum) or a tensor shaped like the target (none), of
// dtype f32 (f64 for f64 logits).
// Target values must lie in [0, C) or equal ignore_index. On the CPU a value
// outside is an error naming it; on CUDA the forward never waits for the device,
// so the check is not made there: such a row's loss (and gradient) is NaN.
// Gradient: dlogits_i = (softmax(logits_i) - onehot(target_i)) * dloss_i, with
// dloss_i = dloss / count for mean, dloss for sum, dloss[i] for none.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean);

// The LM head and its loss in one op, never holding the [N, V] logits:
//   loss = cross_entropy(x W^T, target)     x [N, C], weight [V, C], target [N]
// (mean or sum; `none` is an error). Rows are processed in chunks of
// chunk_rows: each chunk's logits are formed by one GEMM, reduced to per-row
// losses, overwritten in place by their gradient for a unit loss
// (softmax - onehot), and multiplied out into the chunk's share of dx and (when
// the weight needs it) of dW, accumulated in f32/f64. Backward only scales those
// by the incoming gradient (/ count for mean). Peak memory for the head is one
// chunk of logits instead of the logits and their gradient; the GEMM work is the
// same as linear + cross_entropy, done in forward, so a forward whose gradient is
// never asked for (no_grad or nothing requiring grad) does only the first GEMM.
// Autocast: the GEMMs run in the region's dtype (policy lower_precision), the
// loss is f32 as every loss. ignore_index and the target rules are cross_entropy's.
struct LinearCrossEntropyOptions {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
  int64_t chunk_rows = 0;  // 0: as many rows as keep one chunk of logits near 1 GiB
};
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target,
                            const LinearCrossEntropyOptions& options = {});

}  // namespace mt
