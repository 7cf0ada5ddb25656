// CUDA RoPE: one thread per pair (i, i + D/2) of one (b, t, h) row, threads ordered (b, t, h, i)
// with i fastest, so a warp walks the heads of one position as a projection's output stores
// them. The angle's cosine and sine come from sincosf in registers (accurate, not the
// intrinsic: positions reach tens of thousands of radians).
#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/rope/rope_kernels.h"

namespace mt::ops {

namespace {

struct Strides4 {
  int64_t b, h, t;  // the last dimension's stride is 1
};

__device__ inline void sin_cos(float angle, float* s, float* c) { sincosf(angle, s, c); }
__device__ inline void sin_cos(float angle, double* s, double* c) { sincos(static_cast<double>(angle), s, c); }

// ---- kernel ----

template <typename T>
__global__ void rope_kernel(T* out, const T* in, const float* inv_freq, Strides4 so, Strides4 si, int64_t B, int64_t H,
                            int64_t T_, int64_t half, int64_t start, const int64_t* positions, int sign) {
  using A = acc_t<T>;
  const int64_t n = B * T_ * H * half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = (k / half) % H, t = (k / (half * H)) % T_, b = k / (half * H * T_);
    const int64_t position = positions != nullptr ? positions[b * T_ + t] : start + t;
    const float angle = static_cast<float>(position) * inv_freq[i];
    A s, c;
    sin_cos(angle, &s, &c);
    s *= static_cast<A>(sign);
    const T* x = in + b * si.b + h * si.h + t * si.t;
    T* y = out + b * so.b + h * so.h + t * so.t;
    const A x1 = convert<A>(x[i]), x2 = convert<A>(x[i + half]);
    y[i] = convert<T>(x1 * c - x2 * s);
    y[i + half] = convert<T>(x2 * c + x1 * s);
  }
}

}  // namespace

// ---- entry point ----

void rope_cuda(const Tensor& out, const Tensor& in, const Tensor& inv_freq, const RopeRotation& rotation) {
  const int64_t B = in.size(0), H = in.size(1), T = in.size(2), half = in.size(3) / 2;
  const int64_t n = B * H * T * half;
  cuda::DeviceGuard on_device(in.device().index);
  const cuda::Stream stream = cuda::current_stream(in.device().index);
  const Strides4 so{out.stride(0), out.stride(1), out.stride(2)}, si{in.stride(0), in.stride(1), in.stride(2)};
  dispatch_floating(in.dtype(), "rope", [&](auto tag) {
    using Tv = typename decltype(tag)::type;
    rope_kernel<Tv><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<Tv*>(out.data_ptr()), static_cast<const Tv*>(in.data_ptr()),
        static_cast<const float*>(inv_freq.data_ptr()), so, si, B, H, T, half, rotation.start, rotation.positions,
        rotation.sign);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::ops
