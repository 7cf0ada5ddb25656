// CUDA SwiGLU: forward and backward over dense operands in 16-byte packs (8 bf16 per load), the
// math in f32 registers; a tail loop for the last elements and for misaligned storage.
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "ops/elementwise/swiglu_kernels.h"

namespace mt::ops {

namespace {

using cuda::pack_size;

// ---- kernels ----

template <typename T>
__global__ void swiglu_forward_kernel(T* __restrict__ y, const T* __restrict__ gate, const T* __restrict__ up,
                                      int64_t n, bool packed) {
  using A = acc_t<T>;
  constexpr int N = pack_size<T>();
  const auto one = [&](int64_t i) { y[i] = convert<T>(SwigluMath::forward(convert<A>(gate[i]), convert<A>(up[i]))); };
  if (!packed) {
    cuda::for_each_pack<1>(n, one, one);
    return;
  }
  cuda::for_each_pack<N>(
      n,
      [&](int64_t p) {
        A g[N], u[N], out[N];
        cuda::load_pack_as<N>(gate + p * N, g);
        cuda::load_pack_as<N>(up + p * N, u);
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = SwigluMath::forward(g[k], u[k]);
        cuda::store_pack_from<N>(y + p * N, out);
      },
      one);
}

template <typename T>
__global__ void swiglu_backward_kernel(T* __restrict__ dgate, T* __restrict__ dup, const T* __restrict__ dy,
                                       const T* __restrict__ gate, const T* __restrict__ up, int64_t n, bool packed) {
  using A = acc_t<T>;
  constexpr int N = pack_size<T>();
  const auto one = [&](int64_t i) {
    A a, b;
    SwigluMath::backward(convert<A>(dy[i]), convert<A>(gate[i]), convert<A>(up[i]), &a, &b);
    dgate[i] = convert<T>(a);
    dup[i] = convert<T>(b);
  };
  if (!packed) {
    cuda::for_each_pack<1>(n, one, one);
    return;
  }
  cuda::for_each_pack<N>(
      n,
      [&](int64_t p) {
        A d[N], g[N], u[N], dg[N], du[N];
        cuda::load_pack_as<N>(dy + p * N, d);
        cuda::load_pack_as<N>(gate + p * N, g);
        cuda::load_pack_as<N>(up + p * N, u);
#pragma unroll
        for (int k = 0; k < N; ++k) SwigluMath::backward(d[k], g[k], u[k], &dg[k], &du[k]);
        cuda::store_pack_from<N>(dgate + p * N, dg);
        cuda::store_pack_from<N>(dup + p * N, du);
      },
      one);
}

bool all_aligned(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (!cuda::aligned_to(t->data_ptr(), 16)) return false;
  }
  return true;
}

}  // namespace

// ---- entry points ----

void swiglu_forward_cuda(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  cuda::DeviceGuard on_device(gate.device().index);
  const cuda::Stream stream = cuda::current_stream(gate.device().index);
  const bool packed = all_aligned({&out, &gate, &up});
  dispatch_floating(gate.dtype(), "swiglu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t threads = packed ? n / pack_size<T>() + 1 : n;
    swiglu_forward_kernel<T><<<cuda::grid_for(threads), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const T*>(gate.data_ptr()), static_cast<const T*>(up.data_ptr()),
        n, packed);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void swiglu_backward_cuda(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                          const Tensor& up) {
  const int64_t n = gate.numel();
  cuda::DeviceGuard on_device(gate.device().index);
  const cuda::Stream stream = cuda::current_stream(gate.device().index);
  const bool packed = all_aligned({&dgate, &dup, &dy, &gate, &up});
  dispatch_floating(gate.dtype(), "swiglu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t threads = packed ? n / pack_size<T>() + 1 : n;
    swiglu_backward_kernel<T><<<cuda::grid_for(threads), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(dgate.data_ptr()), static_cast<T*>(dup.data_ptr()), static_cast<const T*>(dy.data_ptr()),
        static_cast<const T*>(gate.data_ptr()), static_cast<const T*>(up.data_ptr()), n, packed);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::ops
