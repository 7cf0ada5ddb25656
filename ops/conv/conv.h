// 2-D convolution and pooling over NCHW tensors (batch, channels, height,
// width; width fastest), as torch.nn.functional.conv2d / max_pool2d /
// avg_pool2d with ceil_mode = false.
//
// conv2d (a cross-correlation, as in every deep-learning library):
//   y[n, o, i, j] = b[o] + sum_{c, p, q} x[n, g*Cg + c, i*sh - ph + p*dh, j*sw - pw + q*dw] * w[o, c, p, q]
// with g = o / Og the group of output channel o, Cg = C / groups, Og = O / groups,
// and x read as zero outside [0, H) x [0, W) (zero padding). Output size:
//   OH = (H + 2*ph - dh*(kH - 1) - 1) / sh + 1     (integer division; likewise OW)
// Backward: dx is the transposed convolution of dy with w (col2im), dw the
// correlation of x with dy summed over the batch, db = sum of dy over n, i, j.
//
// Pooling over kH x kW windows, stride (sh, sw), padding (ph, pw):
//   OH = (H + 2*ph - kH) / sh + 1                   (likewise OW)
//   max_pool2d: padded positions never win (they count as -inf); NaN propagates.
//               The gradient goes to the window's maximum; on a tie, to one of
//               the tied elements only (the first on the CPU, cuDNN's choice on CUDA).
//   avg_pool2d: the sum over the window divided by kH * kW: padded positions add
//               zero to the sum but count in the divisor (PyTorch's default
//               count_include_pad = true).
// Padding may be at most half the kernel (PyTorch's rule), so every window holds
// at least one real element.
//
// Inputs of f64, f32, f16 and bf16 work on the CPU and on CUDA (cuDNN); math is in
// f32 for f16/bf16 (f64 for f64) and results have the input's dtype. On CUDA, f32
// convolutions use full-precision FMA math, not TF32 (see conv_cuda.cu).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt {

// Conv2dOptions().stride(2).padding(1).groups(2); each one-argument setter sets
// both height and width, the two-argument ones set them apart.
class Conv2dOptions {
 public:
  Conv2dOptions& stride(int64_t s) { return stride(s, s); }
  Conv2dOptions& stride(int64_t h, int64_t w) {
    stride_h_ = h;
    stride_w_ = w;
    return *this;
  }
  Conv2dOptions& padding(int64_t p) { return padding(p, p); }
  Conv2dOptions& padding(int64_t h, int64_t w) {
    padding_h_ = h;
    padding_w_ = w;
    return *this;
  }
  Conv2dOptions& dilation(int64_t d) { return dilation(d, d); }
  Conv2dOptions& dilation(int64_t h, int64_t w) {
    dilation_h_ = h;
    dilation_w_ = w;
    return *this;
  }
  Conv2dOptions& groups(int64_t g) {
    groups_ = g;
    return *this;
  }

  int64_t stride_h() const { return stride_h_; }
  int64_t stride_w() const { return stride_w_; }
  int64_t padding_h() const { return padding_h_; }
  int64_t padding_w() const { return padding_w_; }
  int64_t dilation_h() const { return dilation_h_; }
  int64_t dilation_w() const { return dilation_w_; }
  int64_t groups() const { return groups_; }

 private:
  int64_t stride_h_ = 1, stride_w_ = 1;
  int64_t padding_h_ = 0, padding_w_ = 0;  // zeros added on each side
  int64_t dilation_h_ = 1, dilation_w_ = 1;
  int64_t groups_ = 1;
};

// Pool2dOptions(2) is a 2x2 window with stride 2; Pool2dOptions(3).stride(2).padding(1).
// The stride defaults to the kernel size.
class Pool2dOptions {
 public:
  explicit Pool2dOptions(int64_t kernel) : Pool2dOptions(kernel, kernel) {}
  Pool2dOptions(int64_t kernel_h, int64_t kernel_w)
      : kernel_h_(kernel_h), kernel_w_(kernel_w), stride_h_(kernel_h), stride_w_(kernel_w) {}
  Pool2dOptions& stride(int64_t s) { return stride(s, s); }
  Pool2dOptions& stride(int64_t h, int64_t w) {
    stride_h_ = h;
    stride_w_ = w;
    return *this;
  }
  Pool2dOptions& padding(int64_t p) { return padding(p, p); }
  Pool2dOptions& padding(int64_t h, int64_t w) {
    padding_h_ = h;
    padding_w_ = w;
    return *this;
  }

  int64_t kernel_h() const { return kernel_h_; }
  int64_t kernel_w() const { return kernel_w_; }
  int64_t stride_h() const { return stride_h_; }
  int64_t stride_w() const { return stride_w_; }
  int64_t padding_h() const { return padding_h_; }
  int64_t padding_w() const { return padding_w_; }

 private:
  int64_t kernel_h_, kernel_w_;
  int64_t stride_h_, stride_w_;
  int64_t padding_h_ = 0, padding_w_ = 0;
};

// x: [N, C, H, W], weight: [O, C / groups, kH, kW], bias: [O] or undefined -> [N, O, OH, OW].
// Errors (naming the op and the shapes): x or weight not 4-D, weight's channels
// times groups != C, groups not dividing C or O, a dilated kernel bigger than
// the padded input, a bias that is not [O], mixed dtypes or devices.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dOptions& options = Conv2dOptions());

// x: [N, C, H, W] -> [N, C, OH, OW].
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
// x: [N, C, H, W] -> [N, C, OH, OW]; the divisor is always kH * kW (count_include_pad = true).
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);

}  // namespace mt
