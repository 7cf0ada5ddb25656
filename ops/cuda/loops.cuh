// CUDA element loops: the device twins of ops/loops.h. Same contract: inputs
// broadcast to the output's shape, one dtype, math in acc_t<T>.
#pragma once

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "core/strided.h"
#include "core/tensor.h"

namespace mt::cuda {

namespace loops_detail {

template <typename T, typename Op>
__global__ void unary_kernel(T* out, StridedIndexer oi, const T* in, StridedIndexer ii, int64_t n, Op op) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[oi.offset(i)] = convert<T>(op(convert<A>(in[ii.offset(i)])));
  }
}

template <typename T, typename Op>
__global__ void binary_kernel(T* out, StridedIndexer oi, const T* a, StridedIndexer ai, const T* b, StridedIndexer bi,
                              int64_t n, Op op) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[oi.offset(i)] = convert<T>(op(convert<A>(a[ai.offset(i)]), convert<A>(b[bi.offset(i)])));
  }
}

template <typename T, typename Op>
__global__ void ternary_kernel(T* out, StridedIndexer oi, const T* a, StridedIndexer ai, const T* b, StridedIndexer bi,
                               const T* c, StridedIndexer ci, int64_t n, Op op) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[oi.offset(i)] =
        convert<T>(op(convert<A>(a[ai.offset(i)]), convert<A>(b[bi.offset(i)]), convert<A>(c[ci.offset(i)])));
  }
}

}  // namespace loops_detail

template <typename Op>
void map_unary(const Tensor& out, const Tensor& in, const char* name, Op op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Stream stream = current_stream(out.device().index);
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    loops_detail::unary_kernel<T, Op><<<grid_for(n), kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), StridedIndexer(out), static_cast<const T*>(in.data_ptr()), StridedIndexer(in),
        n, op);
    MT_CUDA_CHECK_LAUNCH();
  });
}

template <typename Op>
void map_binary(const Tensor& out, const Tensor& a, const Tensor& b, const char* name, Op op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Stream stream = current_stream(out.device().index);
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    loops_detail::binary_kernel<T, Op><<<grid_for(n), kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), StridedIndexer(out), static_cast<const T*>(a.data_ptr()), StridedIndexer(a),
        static_cast<const T*>(b.data_ptr()), StridedIndexer(b), n, op);
    MT_CUDA_CHECK_LAUNCH();
  });
}

template <typename Op>
void map_ternary(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, const char* name, Op op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Stream stream = current_stream(out.device().index);
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    loops_detail::ternary_kernel<T, Op><<<grid_for(n), kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), StridedIndexer(out), static_cast<const T*>(a.data_ptr()), StridedIndexer(a),
        static_cast<const T*>(b.data_ptr()), StridedIndexer(b), static_cast<const T*>(c.data_ptr()), StridedIndexer(c),
        n, op);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::cuda
