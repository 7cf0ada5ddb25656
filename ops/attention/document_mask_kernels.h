// Internal: the document mask of packed sequences (ops/attention/attention.h's document_mask).
// segments [B, T] contiguous i64 or i32; out [B, 1, T, T] contiguous bool, written whole.
#pragma once

#include "core/tensor.h"

namespace mt::ops {

void document_mask_cpu(const Tensor& out, const Tensor& segments);
void document_mask_cuda(const Tensor& out, const Tensor& segments);

}  // namespace mt::ops
