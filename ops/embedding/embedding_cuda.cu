// CUDA embedding kernels. Ids are not checked on the host (that would need a
// device-to-host sync); the kernels stay in bounds: an out-of-range id gives a
// NaN row forward and is skipped backward. The backward scatter-adds with
// atomicAdd into an acc_t buffer (f32, or f64 for f64), so the summation order
// of repeated ids is not deterministic.
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/embedding/embedding_kernels.h"

namespace mt::ops {

namespace {

// ---- kernels ----

// out // [N, C], weight // [V, C], ids // [N]; one thread per output element.
template <typename T, typename I>
__global__ void embedding_forward_kernel(T* out, const T* weight, const I* ids, int64_t N, int64_t C, int64_t V) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i - n * C;
    const auto v = static_cast<int64_t>(ids[n]);
    out[i] = (v >= 0 && v < V) ? weight[v * C + c] : convert<T>(__int_as_float(0x7fc00000));  // NaN
  }
}

// grad_weight // [V, C] in A, grad_out // [N, C], ids // [N]; one thread per grad_out element.
template <typename T, typename A, typename I>
__global__ void embedding_backward_kernel(A* grad_weight, const T* grad_out, const I* ids, int64_t N, int64_t C,
                                          int64_t V) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i - n * C;
    const auto v = static_cast<int64_t>(ids[n]);
    if (v >= 0 && v < V) atomicAdd(grad_weight + v * C + c, convert<A>(grad_out[i]));
  }
}

}  // namespace

// ---- launchers / entry points ----

void embedding_forward_cuda(const Tensor& out, const Tensor& weight, const Tensor& ids) {
  const int64_t N = out.size(0), C = out.size(1), V = weight.size(0);
  if (N * C == 0) return;
  const cuda::Stream stream = cuda::current_stream(out.device().index);
  dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
    using I = typename decltype(id_tag)::type;
    dispatch_floating(out.dtype(), "embedding", [&](auto tag) {
      using T = typename decltype(tag)::type;
      embedding_forward_kernel<T, I><<<cuda::grid_for(N * C), cuda::kBlockSize, 0, stream.handle()>>>(
          static_cast<T*>(out.data_ptr()), static_cast<const T*>(weight.data_ptr()),
          static_cast<const I*>(ids.data_ptr()), N, C, V);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void embedding_backward_cuda(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& ids) {
  const int64_t N = grad_out.size(0), C = grad_out.size(1), V = grad_weight.size(0);
  if (N * C == 0) return;
  const cuda::Stream stream = cuda::current_stream(grad_out.device().index);
  dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
    using I = typename decltype(id_tag)::type;
    dispatch_floating(grad_out.dtype(), "embedding", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      MT_INTERNAL_ASSERT(grad_weight.dtype() == dtype_of<A>(), "embedding: accumulation buffer has the wrong dtype");
      embedding_backward_kernel<T, A, I><<<cuda::grid_for(N * C), cuda::kBlockSize, 0, stream.handle()>>>(
          static_cast<A*>(grad_weight.data_ptr()), static_cast<const T*>(grad_out.data_ptr()),
          static_cast<const I*>(ids.data_ptr()), N, C, V);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mt::ops
