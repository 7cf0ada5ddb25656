// Internal: the softmax row kernels. Every tensor here is contiguous and viewed
// as rows: [rows, cols], the softmax taken over each row (cols > 0).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

enum class SoftmaxKind { softmax, log_softmax };

inline const char* name_of(SoftmaxKind kind) { return kind == SoftmaxKind::softmax ? "softmax" : "log_softmax"; }

// out[r, :] = softmax(x[r, :]) or log_softmax(x[r, :]); out and x: [rows, cols], one dtype.
void softmax_forward_cpu(const Tensor& out, const Tensor& x, int64_t rows, int64_t cols, SoftmaxKind kind);
void softmax_forward_cuda(const Tensor& out, const Tensor& x, int64_t rows, int64_t cols, SoftmaxKind kind);

// dx from dy and the forward output y; dx, dy, y: [rows, cols], one dtype.
void softmax_backward_cpu(const Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols,
                          SoftmaxKind kind);
void softmax_backward_cuda(const Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols,
                           SoftmaxKind kind);

}  // namespace mt::ops
