// CUDA select kernel: the device twin of where_cpu.
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "core/strided.h"
#include "ops/where/where_kernels.h"

namespace mt::ops {

namespace {

// ---- kernel ----

template <typename T>
__global__ void where_kernel(T* out, StridedIndexer oi, const unsigned char* cond, StridedIndexer ci, const T* a,
                             StridedIndexer ai, const T* b, StridedIndexer bi, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[oi.offset(i)] = cond[ci.offset(i)] != 0 ? a[ai.offset(i)] : b[bi.offset(i)];
  }
}

}  // namespace

// ---- entry point ----

void where_cuda(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const cuda::Stream stream = cuda::current_stream(out.device().index);
  dispatch_floating(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    where_kernel<T><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), StridedIndexer(out), static_cast<const unsigned char*>(cond.data_ptr()),
        StridedIndexer(cond), static_cast<const T*>(a.data_ptr()), StridedIndexer(a),
        static_cast<const T*>(b.data_ptr()), StridedIndexer(b), n);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::ops
