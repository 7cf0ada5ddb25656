// CUDA element loops: the device twins of ops/loops.h. Same contract: inputs
// broadcast to the output's shape, one dtype, math in acc_t<T>. When every
// operand is dense and 16-byte aligned (the common case: fresh activations) the
// packed kernels run (core/cuda/packed.cuh); otherwise the strided ones.
#pragma once

#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/packed.cuh"
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

// op over one pack of each input, element by element, in acc_t<T>.
template <typename T, int N, typename Op, typename... Packs>
__device__ __forceinline__ Pack<T, N> apply_to_packs(Op op, const Packs&... in) {
  using A = acc_t<T>;
  Pack<T, N> out;
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = convert<T>(op(convert<A>(in.v[k])...));
  return out;
}

// out = op(in...) over dense operands: each input pack is loaded whole (one 16-byte load)
// before the element loop.
template <typename T, typename Op, typename... In>
__global__ void packed_kernel(T* out, int64_t n, Op op, const In*... in) {
  using A = acc_t<T>;
  constexpr int N = pack_size<T>();
  using P = Pack<T, N>;
  for_each_pack<N>(
      n,
      [&](int64_t i) { reinterpret_cast<P*>(out)[i] = apply_to_packs<T, N>(op, reinterpret_cast<const P*>(in)[i]...); },
      [&](int64_t i) { out[i] = convert<T>(op(convert<A>(in[i])...)); });
}

// Launches packed_kernel for n elements of T.
template <typename T, typename Op, typename... In>
void launch_packed(const Stream& stream, T* out, int64_t n, Op op, const In*... in) {
  packed_kernel<T, Op, In...><<<grid_for(n / pack_size<T>() + 1), kBlockSize, 0, stream.handle()>>>(out, n, op, in...);
  MT_CUDA_CHECK_LAUNCH();
}

// Dense and 16-byte aligned: the packed kernels can read and write t.
inline bool packable(const Tensor& t) { return t.is_contiguous() && aligned_to(t.data_ptr(), 16); }

// The elements of one period of t, an operand expanded to the output's shape, when t is a dense
// block repeated along the output's leading dims (stride 0 there, contiguous after: a bias, or
// a position table added to every sequence of a batch), 16-byte aligned and a whole number of
// packs of T; else 0 (also when t is not expanded at all: packable covers that).
template <typename T>
int64_t repeat_period(const Tensor& t) {
  if (!aligned_to(t.data_ptr(), 16)) return 0;
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  int64_t period = 1;
  auto d = static_cast<int64_t>(shape.size()) - 1;
  for (; d >= 0 && (shape[d] == 1 || strides[d] == period); --d) period *= shape[d];
  for (int64_t k = d; k >= 0; --k) {
    if (shape[k] != 1 && strides[k] != 0) return 0;
  }
  const bool repeated = period < t.numel();
  return repeated && period % pack_size<T>() == 0 ? period : 0;
}

// out = op(a, b) where one operand is dense and the other (a when kRepeatedA, else b) is a
// period of `period_packs` packs repeated along the output (repeat_period): a thread loads its
// pack of the period once and applies it to that pack of every repeat, blockIdx.y picking the
// first repeat. No division per element: the strided kernel takes one per element and operand,
// which made it compute-bound where this path is bound by the bytes.
template <typename T, bool kRepeatedA, typename Op>
__global__ void repeated_binary_kernel(T* out, const T* dense, const T* period, int64_t period_packs, int64_t repeats,
                                       Op op) {
  constexpr int N = pack_size<T>();
  using P = Pack<T, N>;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < period_packs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const P fixed = reinterpret_cast<const P*>(period)[j];
    for (int64_t r = blockIdx.y; r < repeats; r += gridDim.y) {
      const int64_t at = r * period_packs + j;
      const P other = reinterpret_cast<const P*>(dense)[at];
      reinterpret_cast<P*>(out)[at] =
          kRepeatedA ? apply_to_packs<T, N>(op, fixed, other) : apply_to_packs<T, N>(op, other, fixed);
    }
  }
}

// Launches repeated_binary_kernel when out and one of a, b are packable and the other repeats
// a period (repeat_period); returns whether it did.
template <typename T, typename Op>
bool launch_repeated_binary(const Stream& stream, const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  if (!packable(out)) return false;
  const bool a_dense = packable(a), b_dense = packable(b);
  const int64_t a_period = a_dense ? 0 : repeat_period<T>(a), b_period = b_dense ? 0 : repeat_period<T>(b);
  const bool repeated_a = a_period > 0 && b_dense, repeated_b = b_period > 0 && a_dense;
  if (!repeated_a && !repeated_b) return false;
  const int64_t period = repeated_a ? a_period : b_period;
  const int64_t period_packs = period / pack_size<T>(), repeats = out.numel() / period;
  const unsigned x = grid_for(period_packs);
  const unsigned y = static_cast<unsigned>(std::clamp<int64_t>(4 * 132 * 8 / x, 1, std::min<int64_t>(repeats, 65535)));
  const auto* period_data = static_cast<const T*>((repeated_a ? a : b).data_ptr());
  const auto* dense_data = static_cast<const T*>((repeated_a ? b : a).data_ptr());
  auto* out_data = static_cast<T*>(out.data_ptr());
  if (repeated_a) {
    repeated_binary_kernel<T, true, Op>
        <<<dim3(x, y), kBlockSize, 0, stream.handle()>>>(out_data, dense_data, period_data, period_packs, repeats, op);
  } else {
    repeated_binary_kernel<T, false, Op>
        <<<dim3(x, y), kBlockSize, 0, stream.handle()>>>(out_data, dense_data, period_data, period_packs, repeats, op);
  }
  MT_CUDA_CHECK_LAUNCH();
  return true;
}

// out (f32) = op(a, b) over dense operands of which one or both are f16/bf16: packs of 4
// elements (16 bytes of f32, 8 of a half type), the half ones converted in registers.
template <typename Op, typename TA, typename TB>
__global__ void f32_from_mixed_kernel(float* out, const TA* a, const TB* b, int64_t n, Op op) {
  constexpr int N = 4;
  for_each_pack<N>(
      n,
      [&](int64_t i) {
        const Pack<TA, N> x = reinterpret_cast<const Pack<TA, N>*>(a)[i];
        const Pack<TB, N> y = reinterpret_cast<const Pack<TB, N>*>(b)[i];
        Pack<float, N> r;
#pragma unroll
        for (int k = 0; k < N; ++k) r.v[k] = op(convert<float>(x.v[k]), convert<float>(y.v[k]));
        reinterpret_cast<Pack<float, N>*>(out)[i] = r;
      },
      [&](int64_t i) { out[i] = op(convert<float>(a[i]), convert<float>(b[i])); });
}

// Calls fn(TypeTag<T>) for an f32, f16 or bf16 dtype; false for any other.
template <typename Fn>
bool dispatch_f32_or_half(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      fn(TypeTag<float>{});
      return true;
    case DType::f16:
      fn(TypeTag<Half>{});
      return true;
    case DType::bf16:
      fn(TypeTag<BFloat16>{});
      return true;
    default:
      return false;
  }
}

}  // namespace loops_detail

// out = op(a, b) for an f32 out whose inputs mix f32 with f16/bf16 (the residual stream
// plus a GEMM's output under autocast), without first widening the half input into a
// temporary: the same values as that widening, half the bytes. Applies only when a, b
// and out are dense, of out's shape and aligned for the packs; returns false (having done
// nothing) otherwise, and when neither input is a half type.
template <typename Op>
bool map_binary_f32_from_mixed(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  if (out.dtype() != DType::f32 || !(is_half(a.dtype()) || is_half(b.dtype()))) return false;
  if (a.shape() != out.shape() || b.shape() != out.shape()) return false;
  const auto dense = [](const Tensor& t) {
    return t.is_contiguous() && aligned_to(t.data_ptr(), 4 * element_size(t.dtype()));
  };
  if (!dense(out) || !dense(a) || !dense(b)) return false;
  const int64_t n = out.numel();
  if (n == 0) return true;
  const Stream stream = current_stream(out.device().index);
  bool launched = false;
  loops_detail::dispatch_f32_or_half(a.dtype(), [&](auto a_tag) {
    loops_detail::dispatch_f32_or_half(b.dtype(), [&](auto b_tag) {
      using TA = typename decltype(a_tag)::type;
      using TB = typename decltype(b_tag)::type;
      loops_detail::f32_from_mixed_kernel<Op, TA, TB><<<grid_for(n / 4 + 1), kBlockSize, 0, stream.handle()>>>(
          static_cast<float*>(out.data_ptr()), static_cast<const TA*>(a.data_ptr()),
          static_cast<const TB*>(b.data_ptr()), n, op);
      MT_CUDA_CHECK_LAUNCH();
      launched = true;
    });
  });
  return launched;
}

template <typename Op>
void map_unary(const Tensor& out, const Tensor& in, const char* name, Op op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Stream stream = current_stream(out.device().index);
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (loops_detail::packable(out) && loops_detail::packable(in)) {
      loops_detail::launch_packed(stream, static_cast<T*>(out.data_ptr()), n, op, static_cast<const T*>(in.data_ptr()));
      return;
    }
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
    if (loops_detail::packable(out) && loops_detail::packable(a) && loops_detail::packable(b)) {
      loops_detail::launch_packed(stream, static_cast<T*>(out.data_ptr()), n, op, static_cast<const T*>(a.data_ptr()),
                                  static_cast<const T*>(b.data_ptr()));
      return;
    }
    if (loops_detail::launch_repeated_binary<T>(stream, out, a, b, op)) return;
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
    if (loops_detail::packable(out) && loops_detail::packable(a) && loops_detail::packable(b) &&
        loops_detail::packable(c)) {
      loops_detail::launch_packed(stream, static_cast<T*>(out.data_ptr()), n, op, static_cast<const T*>(a.data_ptr()),
                                  static_cast<const T*>(b.data_ptr()), static_cast<const T*>(c.data_ptr()));
      return;
    }
    loops_detail::ternary_kernel<T, Op><<<grid_for(n), kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), StridedIndexer(out), static_cast<const T*>(a.data_ptr()), StridedIndexer(a),
        static_cast<const T*>(b.data_ptr()), StridedIndexer(b), static_cast<const T*>(c.data_ptr()), StridedIndexer(c),
        n, op);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::cuda
