// One block per output element: threads stride over the reduced elements, then
// combine through shared memory. Enough for correctness at every shape; the
// performance work replaces the hot reductions with fused kernels.
#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "core/strided.h"
#include "ops/cuda/map_impl.cuh"
#include "ops/reduction/reducers.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt::ops {

namespace {

constexpr int kReduceThreads = 256;

template <typename T>
__global__ void reduce_kernel(T* out, StridedIndexer oi, const T* in, StridedIndexer ii, int64_t outer, int64_t inner,
                              ReduceKind kind) {
  using A = acc_t<T>;
  __shared__ A partial[kReduceThreads];
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
    A acc = reduce_identity<A>(kind);
    for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
      acc = reduce_combine(kind, acc, convert<A>(in[ii.offset(o * inner + i)]));
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = kReduceThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width)
        partial[threadIdx.x] = reduce_combine(kind, partial[threadIdx.x], partial[threadIdx.x + width]);
      __syncthreads();
    }
    if (threadIdx.x == 0) out[oi.offset(o)] = convert<T>(partial[0]);
    __syncthreads();
  }
}

}  // namespace

void reduce_cuda(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner, ReduceKind kind) {
  if (outer == 0) return;
  const cuda::Stream stream = cuda::current_stream(out.device().index);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(outer, 65535));
  dispatch_floating(in.dtype(), kind == ReduceKind::sum ? "sum" : "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_kernel<T><<<blocks, kReduceThreads, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), StridedIndexer(out), static_cast<const T*>(in.data_ptr()), StridedIndexer(in),
        outer, inner, kind);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::ops

using mt::Tensor;
MT_INSTANTIATE_MAP_BINARY(mt::ops::EqualMask);
