// CUDA element loops behind copy (with dtype conversion), fill and random draws.
// Kernels first, then launchers, then the checked entry points.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/packed.cuh"
#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/random.h"
#include "core/strided.h"

namespace mt::kernels {

namespace {

// ---- kernels ----

template <typename D, typename S>
__global__ void copy_kernel(D* dst, StridedIndexer di, const S* src, StridedIndexer si, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[di.offset(i)] = convert<D>(src[si.offset(i)]);
  }
}

// Dense copies with a dtype conversion: packs of 16 bytes of the source.
template <typename D, typename S>
__global__ void copy_packed_kernel(D* dst, const S* src, int64_t n) {
  constexpr int N = cuda::pack_size<S>();
  cuda::for_each_pack<N>(
      n,
      [&](int64_t i) {
        const cuda::Pack<S, N> x = reinterpret_cast<const cuda::Pack<S, N>*>(src)[i];
        cuda::Pack<D, N> y;
#pragma unroll
        for (int k = 0; k < N; ++k) y.v[k] = convert<D>(x.v[k]);
        reinterpret_cast<cuda::Pack<D, N>*>(dst)[i] = y;
      },
      [&](int64_t i) { dst[i] = convert<D>(src[i]); });
}

// Dense dst += src (gradient accumulation), packs of 16 bytes of the destination.
template <typename D, typename S>
__global__ void accumulate_packed_kernel(D* dst, const S* src, int64_t n) {
  constexpr int N = cuda::pack_size<D>();
  using A = acc_t<D>;
  cuda::for_each_pack<N>(
      n,
      [&](int64_t i) {
        cuda::Pack<D, N> y = reinterpret_cast<cuda::Pack<D, N>*>(dst)[i];
        const cuda::Pack<S, N> x = reinterpret_cast<const cuda::Pack<S, N>*>(src)[i];
#pragma unroll
        for (int k = 0; k < N; ++k) y.v[k] = convert<D>(convert<A>(y.v[k]) + convert<A>(x.v[k]));
        reinterpret_cast<cuda::Pack<D, N>*>(dst)[i] = y;
      },
      [&](int64_t i) { dst[i] = convert<D>(convert<A>(dst[i]) + convert<A>(src[i])); });
}

// Both dense, and each aligned for packs of `pack` elements of its dtype.
bool packable_pair(const Tensor& dst, const Tensor& src, int pack) {
  return dst.is_contiguous() && src.is_contiguous() &&
         cuda::aligned_to(dst.data_ptr(), static_cast<size_t>(pack) * element_size(dst.dtype())) &&
         cuda::aligned_to(src.data_ptr(), static_cast<size_t>(pack) * element_size(src.dtype()));
}

// When dst and src (same shape) are both [rows, cols] matrices with unit stride along
// cols, however their dims are split, their row strides (in elements); a window of a
// wider buffer (narrow along the last dim, a split of a packed qkv) is one. False when
// another layout is needed.
bool as_pitched_rows(const Tensor& dst, const Tensor& src, int64_t* rows, int64_t* cols, int64_t* dst_pitch,
                     int64_t* src_pitch) {
  if (dst.shape() != src.shape()) return false;
  std::vector<int64_t> size, dst_stride, src_stride;  // size-1 dims dropped, innermost last
  for (int64_t d = 0; d < dst.dim(); ++d) {
    if (dst.size(d) == 1) continue;
    size.push_back(dst.size(d));
    dst_stride.push_back(dst.stride(d));
    src_stride.push_back(src.stride(d));
  }
  if (size.empty() || dst_stride.back() != 1 || src_stride.back() != 1) return false;
  // Merge dims into the row, innermost first, while both tensors keep them contiguous.
  size_t d = size.size() - 1;
  int64_t width = size[d];
  while (d > 0 && dst_stride[d - 1] == width && src_stride[d - 1] == width) width *= size[--d];
  if (d == 0) return false;  // wholly contiguous: the dense paths handle it
  // The dims left must form one row dimension with a single stride in each tensor.
  int64_t height = size[d - 1];
  const int64_t dp = dst_stride[d - 1], sp = src_stride[d - 1];
  for (size_t k = d - 1; k > 0; --k) {
    if (dst_stride[k - 1] != dst_stride[k] * size[k] || src_stride[k - 1] != src_stride[k] * size[k]) return false;
    height *= size[k - 1];
  }
  if (dp < width || sp < width) return false;  // overlapping rows (an expanded source): not a plain 2-D copy
  // cudaMemcpy2D takes pitches up to the device's maximum pitch (2^31 - 1 bytes and more).
  const int64_t item = static_cast<int64_t>(element_size(dst.dtype()));
  if (dp * item > INT32_MAX || sp * item > INT32_MAX) return false;
  *rows = height;
  *cols = width;
  *dst_pitch = dp;
  *src_pitch = sp;
  return true;
}

template <typename D, typename S>
__global__ void accumulate_kernel(D* dst, StridedIndexer di, const S* src, StridedIndexer si, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    D& out = dst[di.offset(i)];
    out = convert<D>(convert<acc_t<D>>(out) + convert<acc_t<D>>(src[si.offset(i)]));
  }
}

template <typename T>
__global__ void fill_kernel(T* dst, StridedIndexer di, T value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[di.offset(i)] = value;
  }
}

// In double, each operation rounded on its own (no fused multiply-add), as the host computes it.
template <typename T>
__global__ void arange_kernel(T* dst, double start, double step, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = convert<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
  }
}

template <typename T>
__global__ void random_kernel(T* dst, StridedIndexer di, Distribution dist, double a, double b, uint64_t seed,
                              uint64_t offset, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto u = static_cast<uint64_t>(i);
    dst[di.offset(i)] = dist == Distribution::uniform
                            ? philox::uniform_as<T>(philox::uniform_at(seed, offset, u), a, b)
                            : convert<T>(a + b * static_cast<double>(philox::normal_at(seed, offset, u)));
  }
}

}  // namespace

// ---- entry points ----

void copy_cuda(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  MT_CHECK_T(DeviceError, src.device() == dst.device(), "copy: source on ", src.device().str(), " and destination on ",
             dst.device().str(), " (cross-device copies go through Tensor::copy_)");
  const cuda::Stream stream = cuda::current_stream(dst.device().index);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    MT_CUDA_CHECK(
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream.handle()));
    return;
  }
  int64_t rows = 0, cols = 0, dst_pitch = 0, src_pitch = 0;
  if (dst.dtype() == src.dtype() && as_pitched_rows(dst, src, &rows, &cols, &dst_pitch, &src_pitch)) {
    // Rows of a wider buffer (the windows of a split): the driver's 2-D copy, not a kernel
    // that computes a strided offset per element.
    const size_t item = element_size(dst.dtype());
    MT_CUDA_CHECK(cudaMemcpy2DAsync(dst.data_ptr(), static_cast<size_t>(dst_pitch) * item, src.data_ptr(),
                                    static_cast<size_t>(src_pitch) * item, static_cast<size_t>(cols) * item,
                                    static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream.handle()));
    return;
  }
  const auto packed_dtype = [](DType d) {
    return d == DType::f64 || d == DType::f32 || d == DType::f16 || d == DType::bf16;
  };
  if (packed_dtype(dst.dtype()) && packed_dtype(src.dtype())) {  // casts between these dtypes, dense
    bool done = false;
    dispatch_floating(dst.dtype(), "copy", [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      dispatch_floating(src.dtype(), "copy", [&](auto src_tag) {
        using S = typename decltype(src_tag)::type;
        constexpr int N = cuda::pack_size<S>();
        if (!packable_pair(dst, src, N)) return;
        copy_packed_kernel<D, S><<<cuda::grid_for(n / N + 1), cuda::kBlockSize, 0, stream.handle()>>>(
            static_cast<D*>(dst.data_ptr()), static_cast<const S*>(src.data_ptr()), n);
        MT_CUDA_CHECK_LAUNCH();
        done = true;
      });
    });
    if (done) return;
  }
  const StridedIndexer di(dst), si(src);
  dispatch_all(dst.dtype(), "copy", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_all(src.dtype(), "copy", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      copy_kernel<D, S><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(
          static_cast<D*>(dst.data_ptr()), di, static_cast<const S*>(src.data_ptr()), si, n);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void accumulate_cuda(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const cuda::Stream stream = cuda::current_stream(dst.device().index);
  const StridedIndexer di(dst), si(src);
  dispatch_floating(dst.dtype(), "accumulate_", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_floating(src.dtype(), "accumulate_", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      constexpr int N = cuda::pack_size<D>();
      if (packable_pair(dst, src, N)) {
        accumulate_packed_kernel<D, S><<<cuda::grid_for(n / N + 1), cuda::kBlockSize, 0, stream.handle()>>>(
            static_cast<D*>(dst.data_ptr()), static_cast<const S*>(src.data_ptr()), n);
        MT_CUDA_CHECK_LAUNCH();
        return;
      }
      accumulate_kernel<D, S><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(
          static_cast<D*>(dst.data_ptr()), di, static_cast<const S*>(src.data_ptr()), si, n);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void fill_cuda(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const cuda::Stream stream = cuda::current_stream(dst.device().index);
  if (value == 0.0 && !std::signbit(value) && dst.is_contiguous()) {  // +0 is all zero bits in every dtype
    MT_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream.handle()));
    return;
  }
  const StridedIndexer di(dst);
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_kernel<T><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(static_cast<T*>(dst.data_ptr()), di,
                                                                                convert<T>(value), n);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void arange_cuda(const Tensor& dst, double start, double step) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  MT_INTERNAL_ASSERT(dst.is_contiguous(), "arange_cuda: the destination must be contiguous");
  const cuda::Stream stream = cuda::current_stream(dst.device().index);
  dispatch_all(dst.dtype(), "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    arange_kernel<T>
        <<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(static_cast<T*>(dst.data_ptr()), start, step, n);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void random_cuda(const Tensor& dst, Distribution dist, double a, double b, uint64_t seed, uint64_t offset) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const cuda::Stream stream = cuda::current_stream(dst.device().index);
  const StridedIndexer di(dst);
  dispatch_floating(dst.dtype(), dist == Distribution::uniform ? "rand" : "randn", [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(static_cast<T*>(dst.data_ptr()), di,
                                                                                  dist, a, b, seed, offset, n);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels
