// Internal: the convolution and pooling kernels behind ops/conv/conv.h. Every
// tensor passed here is contiguous NCHW (weights OIHW), all of one floating
// dtype and on one device, with no zero-sized dimension; outputs are allocated
// by the caller and fully overwritten. Validation happened at the boundary.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::ops {

// The sizes of one conv2d call: x [N, C, H, W], w [O, C / groups, kH, kW], y [N, O, OH, OW].
struct Conv2dGeometry {
  int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t stride_h = 1, stride_w = 1, padding_h = 0, padding_w = 0, dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// The sizes of one pooling call: x [N, C, H, W], y [N, C, OH, OW].
struct Pool2dGeometry {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, padding_h = 0, padding_w = 0;
};

enum class PoolKind { max, average };

// ---- CPU (im2col + Eigen GEMM; direct loops for pooling) ----
void conv2d_forward_cpu(const Tensor& y, const Tensor& x, const Tensor& w, const Conv2dGeometry& g);
void conv2d_backward_input_cpu(const Tensor& dx, const Tensor& dy, const Tensor& w, const Conv2dGeometry& g);
void conv2d_backward_weight_cpu(const Tensor& dw, const Tensor& dy, const Tensor& x, const Conv2dGeometry& g);
// indices: i64 [N, C, OH, OW], the argmax of each window as ih * W + iw within its plane.
void max_pool2d_forward_cpu(const Tensor& y, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g);
void max_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy, const Tensor& indices, const Pool2dGeometry& g);
void avg_pool2d_forward_cpu(const Tensor& y, const Tensor& x, const Pool2dGeometry& g);
void avg_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy, const Pool2dGeometry& g);

// ---- CUDA (cuDNN) ----
void conv2d_forward_cuda(const Tensor& y, const Tensor& x, const Tensor& w, const Conv2dGeometry& g);
void conv2d_backward_input_cuda(const Tensor& dx, const Tensor& dy, const Tensor& w, const Conv2dGeometry& g);
void conv2d_backward_weight_cuda(const Tensor& dw, const Tensor& dy, const Tensor& x, const Conv2dGeometry& g);
void pool2d_forward_cuda(const Tensor& y, const Tensor& x, PoolKind kind, const Pool2dGeometry& g);
// y and x (the forward's output and input) are read for max pooling only; average
// pooling passes undefined tensors.
void pool2d_backward_cuda(const Tensor& dx, const Tensor& dy, const Tensor& y, const Tensor& x, PoolKind kind,
                          const Pool2dGeometry& g);

}  // namespace mt::ops
