// CUDA dropout: one thread per Philox counter (four consecutive elements), the
// same numbering as philox::uniform_at and the CPU loop, so both devices draw
// the same mask for the same (seed, offset).
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "core/random.h"
#include "core/strided.h"
#include "ops/dropout/dropout_kernels.h"

namespace mt::ops {

namespace {

// ---- kernel ----

// out // [n] contiguous, in // [n] logical elements read through `ii`.
template <typename T>
__global__ void dropout_kernel(T* out, const T* in, StridedIndexer ii, int64_t n, uint64_t seed, uint64_t offset,
                               double p, acc_t<T> scale) {
  using A = acc_t<T>;
  const int64_t groups = (n + 3) / 4;
  for (int64_t group = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; group < groups;
       group += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const philox::Words words = philox::generate(seed, offset + static_cast<uint64_t>(group));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = group * 4 + lane;
      if (i < n) {
        const bool keep = static_cast<double>(philox::uniform(words.w[lane])) >= p;
        out[i] = convert<T>(convert<A>(in[ii.offset(i)]) * (keep ? scale : A(0)));
      }
    }
  }
}

}  // namespace

// ---- entry point ----

void dropout_cuda(const Tensor& out, const Tensor& in, const DropoutMask& mask) {
  const int64_t n = in.numel();
  if (n == 0) return;
  const int64_t groups = (n + 3) / 4;
  const cuda::Stream stream = cuda::current_stream(out.device().index);
  dispatch_floating(out.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dropout_kernel<T><<<cuda::grid_for(groups), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const T*>(in.data_ptr()), StridedIndexer(in), n, mask.seed,
        mask.offset, mask.p, static_cast<A>(mask.scale));
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::ops
