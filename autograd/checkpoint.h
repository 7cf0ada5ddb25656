// Gradient checkpointing: trade compute for activation memory.
//
//   auto out = mt::checkpoint([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{block->forward(in[0])};
//   },
//                             {x});
//
// The forward runs `fn` without recording a graph and keeps only the inputs, the random
// generators' positions (every device's default Philox generator) and the autocast state.
// When backward reaches the segment it re-runs `fn` with recording, under those saved
// states, and back-propagates through the recomputation: dropout draws the same masks, so
// the gradients equal those without checkpointing bit for bit on the CPU. After the
// recomputation the generators are put back where they were, so later draws do not change.
//
// - Parameters that `fn` uses (captured, not passed) receive their gradients in that inner
//   backward, through their usual accumulators: post-accumulate hooks fire once per use.
// - Inputs need not require grad (frozen LoRA bases, embeddings of a frozen model): the
//   outputs require grad whenever grad mode is on, so backward still reaches the segment
//   and the parameters inside it.
// - Segments nest: a checkpoint inside `fn` records nothing in the outer forward and is
//   itself checkpointed in the recomputation.
// - `fn` must be deterministic in its shapes and dtypes: a recomputation whose output
//   differs raises an error naming the output, both shapes and both dtypes.
// - Inputs must not be modified in place between forward and backward (caught, as for any
//   saved tensor).
// - An op whose state moves on at each call refuses to run in a segment (in_checkpointed_segment):
//   FP8 autocast's Linear layers (ops/fp8/fp8_linear.h), whose recomputation could not repeat the
//   first pass's scales.
// - The recomputation runs under the forward's RebuildSavedGuard state (autograd/grad_mode.h).
// Under NoGradGuard (evaluation) checkpoint just calls fn.
// The recomputation is a range named "checkpoint recompute" (core/nvtx.h) while ranges are on.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace mt {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

// One tensor in, one out.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

// Whether this thread is running a segment's function with recording to come: its first,
// unrecorded pass or its recomputation in backward (not the plain call under NoGradGuard).
bool in_checkpointed_segment();

// Whether this thread is re-running a segment in backward (its innermost segment's pass is the
// recomputation, and grad mode is on). Only the graph of that run is used: the outputs are the roots of the inner
// backward and their values are never read, so the segment may leave unwritten an output that
// no op inside it reads, through an op that records itself without computing its values
// (OutputValues::unread, ops/matmul/matmul.h): a Llama layer's MLP output, which only the next
// layer's add reads.
bool in_recomputation();

}  // namespace mt
