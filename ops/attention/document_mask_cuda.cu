// CUDA document mask: one thread per (b, i, j), j fastest, so a warp writes consecutive bytes of a row
// and reads one segment id per query row (broadcast) and consecutive ids for the keys.
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/attention/document_mask_kernels.h"

namespace mt::ops {

namespace {

template <typename I>
__global__ void document_mask_kernel(bool* out, const I* segments, int64_t B, int64_t T) {
  const int64_t n = B * T * T;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = k % T, i = (k / T) % T, b = k / (T * T);
    out[k] = segments[b * T + i] == segments[b * T + j];
  }
}

}  // namespace

void document_mask_cuda(const Tensor& out, const Tensor& segments) {
  const int64_t B = segments.size(0), T = segments.size(1);
  cuda::DeviceGuard on_device(segments.device().index);
  const cuda::Stream stream = cuda::current_stream(segments.device().index);
  dispatch_index(segments.dtype(), "document_mask", [&](auto tag) {
    using I = typename decltype(tag)::type;
    document_mask_kernel<I><<<cuda::grid_for(B * T * T), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<bool*>(out.data_ptr()), static_cast<const I*>(segments.data_ptr()), B, T);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::ops
