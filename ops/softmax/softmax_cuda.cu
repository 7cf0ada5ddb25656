// CUDA softmax kernels: one block per row of the contiguous [rows, cols] view,
// threads striding over the row, block reductions in acc_t. Each pass re-reads
// the row (from L1/L2 for the row sizes of softmax over a vocabulary or a
// sequence); the fused cross-entropy lives in ops/loss.
#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/math.h"
#include "ops/softmax/block_reduce.cuh"
#include "ops/softmax/softmax_kernels.h"

namespace mt::ops {

namespace {

template <typename T, SoftmaxKind kKind>
__global__ void softmax_forward_kernel(T* out, const T* in, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  __shared__ A scratch[rowwise::kWarpSize];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = in + r * cols;
    T* y = out + r * cols;
    A m = rowwise::Max::identity<A>();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = rowwise::Max{}(m, convert<A>(x[c]));
    m = rowwise::block_reduce(m, rowwise::Max{}, scratch);
    A s = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += math::exp(convert<A>(x[c]) - m);
    s = rowwise::block_reduce(s, rowwise::Sum{}, scratch);
    if constexpr (kKind == SoftmaxKind::softmax) {
      const A inv = A(1) / s;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[c] = convert<T>(math::exp(convert<A>(x[c]) - m) * inv);
    } else {
      const A log_s = math::log(s);
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[c] = convert<T>((convert<A>(x[c]) - m) - log_s);
    }
  }
}

template <typename T, SoftmaxKind kKind>
__global__ void softmax_backward_kernel(T* dx, const T* dy, const T* y, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  __shared__ A scratch[rowwise::kWarpSize];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* g = dy + r * cols;
    const T* out = y + r * cols;
    T* grad = dx + r * cols;
    A s = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      s += kKind == SoftmaxKind::softmax ? convert<A>(g[c]) * convert<A>(out[c]) : convert<A>(g[c]);
    }
    s = rowwise::block_reduce(s, rowwise::Sum{}, scratch);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      if constexpr (kKind == SoftmaxKind::softmax) {
        grad[c] = convert<T>(convert<A>(out[c]) * (convert<A>(g[c]) - s));
      } else {
        grad[c] = convert<T>(convert<A>(g[c]) - math::exp(convert<A>(out[c])) * s);
      }
    }
  }
}

template <SoftmaxKind kKind>
void launch_forward(const Tensor& out, const Tensor& x, int64_t rows, int64_t cols) {
  const cuda::Stream stream = cuda::current_stream(x.device().index);
  dispatch_floating(x.dtype(), name_of(kKind), [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_forward_kernel<T, kKind><<<rowwise::row_grid(rows), rowwise::row_block_threads(cols), 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const T*>(x.data_ptr()), rows, cols);
    MT_CUDA_CHECK_LAUNCH();
  });
}

template <SoftmaxKind kKind>
void launch_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols) {
  const cuda::Stream stream = cuda::current_stream(y.device().index);
  dispatch_floating(y.dtype(), name_of(kKind), [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T, kKind>
        <<<rowwise::row_grid(rows), rowwise::row_block_threads(cols), 0, stream.handle()>>>(
            static_cast<T*>(dx.data_ptr()), static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(y.data_ptr()),
            rows, cols);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void softmax_forward_cuda(const Tensor& out, const Tensor& x, int64_t rows, int64_t cols, SoftmaxKind kind) {
  if (rows == 0) return;
  if (kind == SoftmaxKind::softmax) {
    launch_forward<SoftmaxKind::softmax>(out, x, rows, cols);
  } else {
    launch_forward<SoftmaxKind::log_softmax>(out, x, rows, cols);
  }
}

void softmax_backward_cuda(const Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols,
                           SoftmaxKind kind) {
  if (rows == 0) return;
  if (kind == SoftmaxKind::softmax) {
    launch_backward<SoftmaxKind::softmax>(dx, dy, y, rows, cols);
  } else {
    launch_backward<SoftmaxKind::log_softmax>(dx, dy, y, rows, cols);
  }
}

}  // namespace mt::ops
