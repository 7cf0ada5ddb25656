// Internal: the reduction loop. `in` is a view whose first dims are kept and
// whose last dims are reduced: out[o] = reduce(in[o, 0..inner)) for o < outer.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

enum class ReduceKind { sum, max };

void reduce_cpu(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner, ReduceKind kind);
void reduce_cuda(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner, ReduceKind kind);

}  // namespace mt::ops
