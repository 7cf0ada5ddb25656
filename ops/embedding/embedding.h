// Embedding lookup: each id selects one row of the weight table.
//
//   weight // [V, C]   floating (f64, f32, f16, bf16)
//   ids    // [...]    i64 or i32, each in [0, V); not differentiable
//   out    // [..., C] out[..., c] = weight[ids[...], c]
//
// Backward: dweight[v, c] = sum over positions n with ids[n] == v of dy[n, c]
// (a scatter-add; rows no id selects get zero). The sum accumulates in acc_t
// (f32 for f16/bf16, f64 for f64) and is rounded once to the weight's dtype.
// On CUDA the scatter-add uses atomicAdd into that accumulation buffer, so
// repeated ids are summed in an unspecified order: the result is not bitwise
// deterministic from run to run in f32 (the CPU path is).
//
// Ids are validated on the CPU path (an out-of-range id throws, naming it and V).
// On CUDA they are NOT checked on the host, since that would need a device-to-
// host sync; the kernels never read or write out of bounds: an out-of-range id
// yields a row of NaN in the output and contributes nothing to dweight.
#pragma once

#include "core/tensor.h"

namespace mt {

Tensor embedding(const Tensor& weight /*[V, C]*/, const Tensor& ids /*[...] i64 or i32*/);  // -> [..., C]

}  // namespace mt
