// The conv family on CUDA, through cuDNN 9's legacy API (cudnnConvolutionForward
// / BackwardData / BackwardFilter, cudnnPoolingForward / Backward): what both
// the GPU machine's cuDNN 9.14 and the build machine's 9.19 offer. No kernels of
// our own: RAII descriptors first, then the per-device handle, then the
// algorithm choice, then the checked entry points.
//
// Types (data, compute, math) per dtype:
//   f64  DOUBLE    compute DOUBLE  default math
//   f32  FLOAT     compute FLOAT   FMA math: no TF32, so f32 results match an f64
//                                  reference to ~1e-6. PyTorch allows TF32 for
//                                  convolutions by default; that switch comes later.
//   f16  HALF      compute FLOAT   tensor-op math
//   bf16 BFLOAT16  compute FLOAT   tensor-op math
// cuDNN's legacy descriptors take int sizes, so every tensor must have fewer
// than 2^31 elements (checked).
#include <cudnn.h>

#include <array>
#include <climits>
#include <memory>
#include <mutex>
#include <string>

#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/backends.h"
#include "ops/conv/conv_kernels.h"
#include "ops/cuda/cudnn_handle.h"

namespace mt::ops {

namespace {

// ---- RAII ----

using cuda::DeviceGuard;  // cuDNN calls run with the tensor's device current

// Owns one cuDNN descriptor; cannot be copied. The subclasses fill it in their
// constructors (a throw there still destroys it, the base being complete).
template <typename Desc, cudnnStatus_t (*Create)(Desc*), cudnnStatus_t (*Destroy)(Desc)>
class Descriptor {
 public:
  Descriptor() { MT_CUDNN_CHECK(Create(&desc_)); }
  ~Descriptor() { Destroy(desc_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Desc get() const { return desc_; }

 private:
  Desc desc_ = nullptr;
};

int to_int(int64_t v) {
  MT_INTERNAL_ASSERT(v >= 0 && v <= INT_MAX, "size ", v, " does not fit cuDNN's int");
  return static_cast<int>(v);
}

// A contiguous NCHW tensor.
class TensorDescriptor
    : public Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor> {
 public:
  TensorDescriptor(cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w) {
    MT_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(get(), CUDNN_TENSOR_NCHW, type, to_int(n), to_int(c), to_int(h), to_int(w)));
  }
};

// A contiguous OIHW filter: [O, C / groups, kH, kW].
class FilterDescriptor
    : public Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor> {
 public:
  FilterDescriptor(cudnnDataType_t type, const Conv2dGeometry& g) {
    MT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(get(), type, CUDNN_TENSOR_NCHW, to_int(g.out_channels),
                                              to_int(g.in_channels / g.groups), to_int(g.kernel_h),
                                              to_int(g.kernel_w)));
  }
};

// The per-dtype types of the table at the top.
struct CudnnTypes {
  cudnnDataType_t data = CUDNN_DATA_FLOAT;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_FMA_MATH;
};

template <typename T>
struct CudnnTraits;
template <>
struct CudnnTraits<double> {
  static constexpr CudnnTypes types{CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH};
};
template <>
struct CudnnTraits<float> {
  static constexpr CudnnTypes types{CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH};
};
template <>
struct CudnnTraits<Half> {
  static constexpr CudnnTypes types{CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH};
};
template <>
struct CudnnTraits<BFloat16> {
  static constexpr CudnnTypes types{CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH};
};

CudnnTypes cudnn_types(DType dtype, const char* op) {
  return dispatch_floating(dtype, op, [](auto tag) { return CudnnTraits<typename decltype(tag)::type>::types; });
}

// f32 convolutions may use TF32 tensor cores when the switch allows it (on by
// default, as in PyTorch; ops/backends.h); otherwise they keep FMA math.
CudnnTypes with_tf32_switch(CudnnTypes types) {
  if (types.data == CUDNN_DATA_FLOAT && backends::allow_tf32_conv()) types.math = CUDNN_DEFAULT_MATH;
  return types;
}

class ConvolutionDescriptor : public Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                                cudnnDestroyConvolutionDescriptor> {
 public:
  ConvolutionDescriptor(const CudnnTypes& types, const Conv2dGeometry& g) {
    MT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(get(), to_int(g.padding_h), to_int(g.padding_w), to_int(g.stride_h),
                                                   to_int(g.stride_w), to_int(g.dilation_h), to_int(g.dilation_w),
                                                   CUDNN_CROSS_CORRELATION, types.compute));
    MT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(get(), to_int(g.groups)));
    MT_CUDNN_CHECK(cudnnSetConvolutionMathType(get(), types.math));
  }
};

class PoolingDescriptor
    : public Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor> {
 public:
  PoolingDescriptor(PoolKind kind, const Pool2dGeometry& g) {
    // The deterministic max mode: its backward gives the same bits on every run.
    // Padded positions never win a max (they are not read); the average counts them.
    const cudnnPoolingMode_t mode =
        kind == PoolKind::max ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    MT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(get(), mode, CUDNN_PROPAGATE_NAN, to_int(g.kernel_h), to_int(g.kernel_w),
                                               to_int(g.padding_h), to_int(g.padding_w), to_int(g.stride_h),
                                               to_int(g.stride_w)));
  }
};

// Every descriptor of one convolution.
struct ConvDescriptors {
  CudnnTypes types;
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  ConvDescriptors(DType dtype, const Conv2dGeometry& g)
      : types(with_tf32_switch(cudnn_types(dtype, "conv2d"))),
        x(types.data, g.batch, g.in_channels, g.in_h, g.in_w),
        y(types.data, g.batch, g.out_channels, g.out_h, g.out_w),
        w(types.data, g),
        conv(types, g) {}
};

// alpha = 1 and beta = 0 (overwrite the output), as cuDNN reads them: double for
// double data, float otherwise.
class Scaling {
 public:
  explicit Scaling(cudnnDataType_t data) : wide_(data == CUDNN_DATA_DOUBLE) {}
  const void* one() const { return wide_ ? static_cast<const void*>(&one_d_) : &one_f_; }
  const void* zero() const { return wide_ ? static_cast<const void*>(&zero_d_) : &zero_f_; }

 private:
  bool wide_;
  double one_d_ = 1.0, zero_d_ = 0.0;
  float one_f_ = 1.0f, zero_f_ = 0.0f;
};

void check_int_sized(const char* op, const Tensor& t) {
  MT_CHECK_T(ShapeError, t.numel() <= INT_MAX, op,
             ": cuDNN's legacy API takes tensors of fewer than 2^31 elements, got ", dtype_name(t.dtype()),
             shape_str(t.shape()));
}

std::string describe_problem(DType dtype, const Conv2dGeometry& g) {
  return detail::str_cat(dtype_name(dtype), " x [", g.batch, ", ", g.in_channels, ", ", g.in_h, ", ", g.in_w,
                         "], weight [", g.out_channels, ", ", g.in_channels / g.groups, ", ", g.kernel_h, ", ",
                         g.kernel_w, "], stride ", g.stride_h, "x", g.stride_w, ", padding ", g.padding_h, "x",
                         g.padding_w, ", dilation ", g.dilation_h, "x", g.dilation_w, ", groups ", g.groups);
}

// ---- algorithm choice ----

// cuDNN's heuristics (the *_v7 queries) rank the algorithms for the problem; we
// take the first one that is usable (status SUCCESS). With TF32 off, f32 must
// use an FMA-math algorithm: a tensor-op entry would round to TF32. `query(requested, &returned, perf)` runs the
// heuristic.
template <typename Perf, typename Query>
Perf choose_algorithm(const char* pass, const ConvDescriptors& d, DType dtype, const Conv2dGeometry& g, Query query) {
  std::array<Perf, 16> perf{};  // more than any cuDNN 9 algorithm count (8, 6 and 7)
  int returned = 0;
  MT_CUDNN_CHECK(query(static_cast<int>(perf.size()), &returned, perf.data()));
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (d.types.math == CUDNN_FMA_MATH && perf[i].mathType != CUDNN_FMA_MATH) continue;
    return perf[i];
  }
  throw NotImplementedError(detail::str_cat("conv2d: cuDNN offers no ", pass, " algorithm for ",
                                            describe_problem(dtype, g), " (", returned, " candidates, none usable)"));
}

// cuDNN decides tensor-core use from the algorithm and the descriptor's math
// type together, so the descriptor takes the chosen algorithm's math type.
template <typename Perf>
void use_math_of(const ConvDescriptors& d, const Perf& perf) {
  MT_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), perf.mathType));
}

}  // namespace

// ---- entry points ----

void conv2d_forward_cuda(const Tensor& y, const Tensor& x, const Tensor& w, const Conv2dGeometry& g) {
  for (const Tensor* t : {&y, &x, &w}) check_int_sized("conv2d", *t);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const ConvDescriptors d(x.dtype(), g);
  CudnnHandle handle(device);
  const auto perf = choose_algorithm<cudnnConvolutionFwdAlgoPerf_t>(
      "forward", d, x.dtype(), g, [&](int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
        return cudnnGetConvolutionForwardAlgorithm_v7(handle.get(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                      requested, returned, results);
      });
  use_math_of(d, perf);
  size_t bytes = 0;
  MT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle.get(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                         perf.algo, &bytes));
  const CudnnWorkspace workspace(bytes, x.device());
  const Scaling s(d.types.data);
  MT_CUDNN_CHECK(cudnnConvolutionForward(handle.get(), s.one(), d.x.get(), x.data_ptr(), d.w.get(), w.data_ptr(),
                                         d.conv.get(), perf.algo, workspace.data(), workspace.bytes(), s.zero(),
                                         d.y.get(), y.data_ptr()));
}

void conv2d_backward_input_cuda(const Tensor& dx, const Tensor& dy, const Tensor& w, const Conv2dGeometry& g) {
  for (const Tensor* t : {&dx, &dy, &w}) check_int_sized("conv2d", *t);
  const int device = w.device().index;
  DeviceGuard guard(device);
  const ConvDescriptors d(w.dtype(), g);
  CudnnHandle handle(device);
  const auto perf = choose_algorithm<cudnnConvolutionBwdDataAlgoPerf_t>(
      "backward-data", d, w.dtype(), g, [&](int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle.get(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                           requested, returned, results);
      });
  use_math_of(d, perf);
  size_t bytes = 0;
  MT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle.get(), d.w.get(), d.y.get(), d.conv.get(),
                                                              d.x.get(), perf.algo, &bytes));
  const CudnnWorkspace workspace(bytes, w.device());
  const Scaling s(d.types.data);
  MT_CUDNN_CHECK(cudnnConvolutionBackwardData(handle.get(), s.one(), d.w.get(), w.data_ptr(), d.y.get(), dy.data_ptr(),
                                              d.conv.get(), perf.algo, workspace.data(), workspace.bytes(), s.zero(),
                                              d.x.get(), dx.data_ptr()));
}

void conv2d_backward_weight_cuda(const Tensor& dw, const Tensor& dy, const Tensor& x, const Conv2dGeometry& g) {
  for (const Tensor* t : {&dw, &dy, &x}) check_int_sized("conv2d", *t);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const ConvDescriptors d(x.dtype(), g);
  CudnnHandle handle(device);
  const auto perf = choose_algorithm<cudnnConvolutionBwdFilterAlgoPerf_t>(
      "backward-filter", d, x.dtype(), g,
      [&](int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* results) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle.get(), d.x.get(), d.y.get(), d.conv.get(),
                                                             d.w.get(), requested, returned, results);
      });
  use_math_of(d, perf);
  size_t bytes = 0;
  MT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle.get(), d.x.get(), d.y.get(), d.conv.get(),
                                                                d.w.get(), perf.algo, &bytes));
  const CudnnWorkspace workspace(bytes, x.device());
  const Scaling s(d.types.data);
  MT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle.get(), s.one(), d.x.get(), x.data_ptr(), d.y.get(),
                                                dy.data_ptr(), d.conv.get(), perf.algo, workspace.data(),
                                                workspace.bytes(), s.zero(), d.w.get(), dw.data_ptr()));
}

void pool2d_forward_cuda(const Tensor& y, const Tensor& x, PoolKind kind, const Pool2dGeometry& g) {
  const char* op = kind == PoolKind::max ? "max_pool2d" : "avg_pool2d";
  for (const Tensor* t : {&y, &x}) check_int_sized(op, *t);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const CudnnTypes types = cudnn_types(x.dtype(), op);
  const TensorDescriptor xd(types.data, g.batch, g.channels, g.in_h, g.in_w);
  const TensorDescriptor yd(types.data, g.batch, g.channels, g.out_h, g.out_w);
  const PoolingDescriptor pd(kind, g);
  CudnnHandle handle(device);
  const Scaling s(types.data);
  MT_CUDNN_CHECK(
      cudnnPoolingForward(handle.get(), pd.get(), s.one(), xd.get(), x.data_ptr(), s.zero(), yd.get(), y.data_ptr()));
}

void pool2d_backward_cuda(const Tensor& dx, const Tensor& dy, const Tensor& y, const Tensor& x, PoolKind kind,
                          const Pool2dGeometry& g) {
  const char* op = kind == PoolKind::max ? "max_pool2d" : "avg_pool2d";
  for (const Tensor* t : {&dx, &dy}) check_int_sized(op, *t);
  const int device = dx.device().index;
  DeviceGuard guard(device);
  const CudnnTypes types = cudnn_types(dx.dtype(), op);
  const TensorDescriptor xd(types.data, g.batch, g.channels, g.in_h, g.in_w);
  const TensorDescriptor yd(types.data, g.batch, g.channels, g.out_h, g.out_w);
  const PoolingDescriptor pd(kind, g);
  // Max pooling finds each window's maximum again from x and y. Average pooling
  // reads neither, but cuDNN still takes them: dy and dx (same shapes) stand in.
  const void* y_data = kind == PoolKind::max ? y.data_ptr() : dy.data_ptr();
  const void* x_data = kind == PoolKind::max ? x.data_ptr() : dx.data_ptr();
  CudnnHandle handle(device);
  const Scaling s(types.data);
  MT_CUDNN_CHECK(cudnnPoolingBackward(handle.get(), pd.get(), s.one(), yd.get(), y_data, yd.get(), dy.data_ptr(),
                                      xd.get(), x_data, s.zero(), xd.get(), dx.data_ptr()));
}

}  // namespace mt::ops
