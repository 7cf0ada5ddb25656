// CUDA FP8 casts and scale updates.
//
// The cast reads x once: each thread converts its elements, writes the FP8 bytes (through a
// shared-memory tile when transposing) and keeps a running max of |x|; the block reduces those and
// one thread folds the block's maximum into the f32 amax with a single atomicMax on its bits
// (abs_bits: nonnegative floats order as unsigned integers, NaN above all). Chosen over a second
// reduction pass because a max is exact in any order, so the atomic result is deterministic, and
// the amax then costs no extra launch and no partials buffer; the amax word is zeroed on the
// stream first (graph-capturable).

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/fp8/fp8_convert.cuh"
#include "ops/fp8/fp8_kernels.h"

namespace mt::ops {

namespace {

constexpr int kThreads = 256;
constexpr int kVec = 16;   // elements a thread casts per step of the flat kernel: one 16-byte FP8 store
constexpr int kTile = 64;  // the transposing kernel's tiles: kTile x kTile elements per block
// Shared tile row pitch in bytes: 4-byte aligned rows, and an odd word count so that neither the
// row-wise writes nor the column-wise reads of a warp meet more than two to a bank.
constexpr int kTilePitch = kTile + 4;
constexpr int kChunk = 8;  // consecutive elements a thread loads in the transposing kernel

// ---- kernels ----

// Folds every thread's m into *amax_bits: warp shuffles, then one atomicMax per block, skipped
// when the word already holds as much (it only grows, so a stale read can only skip less).
__device__ __forceinline__ void block_amax(uint32_t m, uint32_t* amax_bits) {
  __shared__ uint32_t warp_max[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp != 0) return;
  m = lane < kThreads / 32 ? warp_max[lane] : 0u;
  for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0 && m > *static_cast<volatile uint32_t*>(amax_bits)) atomicMax(amax_bits, m);
}

// out [n] = fp8(x * scale) (out null: the amax alone). kPacked: x and out 16-byte aligned, each
// thread moves kVec elements per step (16-byte loads of x, one 16-byte store).
template <typename Format, typename T, bool kPacked>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const T* __restrict__ x, uint8_t* __restrict__ out, int64_t n, const float* __restrict__ scale_ptr,
                    uint32_t* amax_bits) {
  const float scale = out != nullptr ? *scale_ptr : 0.0f;
  uint32_t m = 0;
  const auto one = [&](int64_t i) {
    const float v = convert<float>(x[i]);
    m = max(m, abs_bits(v));
    if (out != nullptr) out[i] = Format::from_f32(scaled(v, scale));
  };
  if constexpr (kPacked) {
    constexpr int P = cuda::pack_size<T>();
    cuda::for_each_pack<kVec>(
        n,
        [&](int64_t p) {
          float v[kVec];
#pragma unroll
          for (int j = 0; j < kVec / P; ++j) cuda::load_pack_as<P>(x + p * kVec + j * P, v + j * P);
#pragma unroll
          for (int k = 0; k < kVec; ++k) m = max(m, abs_bits(v[k]));
          if (out == nullptr) return;
          cuda::Pack<uint32_t, kVec / 4> words;
#pragma unroll
          for (int k = 0; k < kVec / 4; ++k) words.v[k] = fp8_word<Format>(v + 4 * k, scale);
          reinterpret_cast<cuda::Pack<uint32_t, kVec / 4>*>(out)[p] = words;
        },
        one);
  } else {
    cuda::for_each_pack<1>(n, one, one);
  }
  block_amax(m, amax_bits);
}

// x [rows, cols] -> out [cols, rows] = fp8(x^T * scale), one kTile x kTile tile per block: loaded
// along x's rows (coalesced), cast into shared memory, written along out's rows (coalesced). With
// out_rows, the cast is also written in x's own layout straight from the registers (Fp8Layout::both).
// packed_loads: x 16-byte aligned with rows of a multiple of 16 bytes; packed_stores: out 4-byte
// aligned and rows a multiple of 4; packed_row_stores: out_rows 8-byte aligned, cols a multiple of 8.
template <typename Format, typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_transpose_kernel(const T* __restrict__ x, uint8_t* __restrict__ out, uint8_t* __restrict__ out_rows,
                              int64_t rows, int64_t cols, const float* __restrict__ scale_ptr, uint32_t* amax_bits,
                              bool packed_loads, bool packed_stores, bool packed_row_stores) {
  __shared__ __align__(16) uint8_t tile[kTile][kTilePitch];  // [row - r0][col - c0]
  const float scale = *scale_ptr;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  uint32_t m = 0;
  for (int c = threadIdx.x; c < kTile * (kTile / kChunk); c += kThreads) {
    const int tr = c / (kTile / kChunk), tc = (c % (kTile / kChunk)) * kChunk;
    const int64_t r = r0 + tr, col = c0 + tc;
    const T* src = x + r * cols + col;
    float v[kChunk];
    if (packed_loads && r < rows && col + kChunk <= cols) {
      constexpr int P = cuda::pack_size<T>() < kChunk ? cuda::pack_size<T>() : kChunk;
#pragma unroll
      for (int j = 0; j < kChunk / P; ++j) cuda::load_pack_as<P>(src + j * P, v + j * P);
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[k] = r < rows && col + k < cols ? convert<float>(src[k]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) m = max(m, abs_bits(v[k]));
    const uint2 words = make_uint2(fp8_word<Format>(v, scale), fp8_word<Format>(v + 4, scale));
    auto* dst = reinterpret_cast<uint32_t*>(&tile[tr][tc]);
    dst[0] = words.x;
    dst[1] = words.y;
    if (out_rows != nullptr && r < rows) {
      uint8_t* row_dst = out_rows + r * cols + col;  // col is a multiple of kChunk
      if (packed_row_stores && col + kChunk <= cols) {
        *reinterpret_cast<uint2*>(row_dst) = words;
      } else {
        for (int k = 0; k < kChunk && col + k < cols; ++k)
          row_dst[k] = static_cast<uint8_t>((k < 4 ? words.x : words.y) >> (8 * (k % 4)));
      }
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kTile * (kTile / 4); c += kThreads) {
    const int oc = c / (kTile / 4), orow = (c % (kTile / 4)) * 4;  // out row c0 + oc, columns r0 + orow + [0, 4)
    const int64_t col = c0 + oc, r = r0 + orow;
    if (col >= cols || r >= rows) continue;
    const uint32_t word = tile[orow][oc] | (tile[orow + 1][oc] << 8) | (tile[orow + 2][oc] << 16) |
                          (static_cast<uint32_t>(tile[orow + 3][oc]) << 24);
    uint8_t* dst = out + col * rows + r;
    if (packed_stores && r + 4 <= rows) {
      *reinterpret_cast<uint32_t*>(dst) = word;
    } else {
      for (int k = 0; k < 4 && r + k < rows; ++k) dst[k] = static_cast<uint8_t>(word >> (8 * k));
    }
  }
  block_amax(m, amax_bits);
}

// out [n] = q / scale. kPacked: q and out 16-byte aligned; kVec elements per step.
template <typename Format, typename T, bool kPacked>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const uint8_t* __restrict__ q, T* __restrict__ out,
                                                              int64_t n, const float* __restrict__ scale_ptr) {
  const float scale = *scale_ptr;
  const auto one = [&](int64_t i) { out[i] = convert<T>(Format::to_f32(q[i]) / scale); };
  if constexpr (kPacked) {
    constexpr int P = cuda::pack_size<T>();
    cuda::for_each_pack<kVec>(
        n,
        [&](int64_t p) {
          const auto in = reinterpret_cast<const cuda::Pack<uint8_t, kVec>*>(q)[p];
          float v[kVec];
#pragma unroll
          for (int k = 0; k < kVec; ++k) v[k] = Format::to_f32(in.v[k]) / scale;
#pragma unroll
          for (int j = 0; j < kVec / P; ++j) cuda::store_pack_from<P>(out + p * kVec + j * P, v + j * P);
        },
        one);
  } else {
    cuda::for_each_pack<1>(n, one, one);
  }
}

// One block. The history rolls in place, highest chunk first: the chunk at `off` reads
// [off - 1, off + kThreads - 1) before its barrier and writes [off, off + kThreads) after it, and
// the chunk below overwrites off - 1 only after its own barrier, which follows that read.
__global__ void __launch_bounds__(kThreads)
    delayed_update_kernel(float* history, int64_t len, float* scale, float* scale_inv, const float* new_amax,
                          int64_t* overflows, bool most_recent, float scaled_max, float saturation_bound) {
  __shared__ float warp_max[kThreads / 32];
  const float newest = *new_amax;
  float m = 0.0f;
  for (int64_t off = (len - 1) / kThreads * kThreads; off >= 0; off -= kThreads) {
    const int64_t i = off + threadIdx.x;
    float a = 0.0f;
    if (i < len) {
      a = i > 0 ? history[i - 1] : newest;
      m = fmaxf(m, a);
    }
    __syncthreads();
    if (i < len) history[i] = a;
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  const float used = *scale;
  if (saturated(newest, used, saturation_bound)) ++*overflows;
  const float s = scale_from_amax(most_recent ? newest : m, scaled_max, used);
  *scale = s;
  *scale_inv = 1.0f / s;
}

__global__ void current_scale_kernel(const float* amax, float* scale, float* scale_inv, float scaled_max) {
  const float s = scale_from_amax(*amax, scaled_max, 1.0f);
  *scale = s;
  *scale_inv = 1.0f / s;
}

// ---- launchers ----

template <typename Format, typename T>
void launch_quantize(const cuda::Stream& stream, const Tensor& x, const Tensor& scale, const Tensor& out,
                     const Tensor& out_t, uint32_t* amax_bits) {
  const T* in = static_cast<const T*>(x.data_ptr());
  uint8_t* o = out.defined() ? static_cast<uint8_t*>(out.data_ptr()) : nullptr;
  const auto* s = scale.defined() ? static_cast<const float*>(scale.data_ptr()) : nullptr;  // null: the amax alone
  const int64_t n = x.numel();
  if (out_t.defined()) {
    auto* o_t = static_cast<uint8_t*>(out_t.data_ptr());
    const int64_t rows = x.size(0), cols = x.size(1);
    const dim3 grid(static_cast<unsigned>((rows + kTile - 1) / kTile),
                    static_cast<unsigned>((cols + kTile - 1) / kTile));
    const bool packed_loads = cuda::aligned_to(in, 16) && (cols * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    const bool packed_stores = cuda::aligned_to(o_t, 4) && rows % 4 == 0;
    const bool packed_row_stores = cuda::aligned_to(o, 8) && cols % 8 == 0;
    quantize_transpose_kernel<Format, T><<<grid, kThreads, 0, stream.handle()>>>(
        in, o_t, o, rows, cols, s, amax_bits, packed_loads, packed_stores, packed_row_stores);
  } else if (cuda::aligned_to(in, 16) && (o == nullptr || cuda::aligned_to(o, 16))) {
    quantize_kernel<Format, T, true>
        <<<cuda::grid_for(n / kVec + 1, kThreads), kThreads, 0, stream.handle()>>>(in, o, n, s, amax_bits);
  } else {
    quantize_kernel<Format, T, false>
        <<<cuda::grid_for(n, kThreads), kThreads, 0, stream.handle()>>>(in, o, n, s, amax_bits);
  }
  MT_CUDA_CHECK_LAUNCH();
}

template <typename Format>
void launch_dequantize(const cuda::Stream& stream, const Tensor& q, const Tensor& scale, const Tensor& out) {
  const auto* in = static_cast<const uint8_t*>(q.data_ptr());
  const auto* s = static_cast<const float*>(scale.data_ptr());
  const int64_t n = q.numel();
  dispatch_floating(out.dtype(), "dequantize_fp8", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data_ptr());
    if (cuda::aligned_to(in, 16) && cuda::aligned_to(o, 16)) {
      dequantize_kernel<Format, T, true>
          <<<cuda::grid_for(n / kVec + 1, kThreads), kThreads, 0, stream.handle()>>>(in, o, n, s);
    } else {
      dequantize_kernel<Format, T, false><<<cuda::grid_for(n, kThreads), kThreads, 0, stream.handle()>>>(in, o, n, s);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// ---- entry points ----

void quantize_cuda(const Tensor& x, const Tensor& scale, const Tensor& out, const Tensor& out_t, const Tensor& amax) {
  const int device = x.device().index;
  cuda::DeviceGuard on_device(device);
  const cuda::Stream stream = cuda::current_stream(device);
  auto* amax_bits = static_cast<uint32_t*>(amax.data_ptr());
  MT_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream.handle()));
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), "quantize_fp8", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tensor& format = out.defined() ? out : out_t;
    if (!format.defined() || format.dtype() == DType::f8e4m3) {
      launch_quantize<F8E4M3Format, T>(stream, x, scale, out, out_t, amax_bits);
    } else {
      launch_quantize<F8E5M2Format, T>(stream, x, scale, out, out_t, amax_bits);
    }
  });
}

void dequantize_cuda(const Tensor& q, const Tensor& scale, const Tensor& out) {
  if (q.numel() == 0) return;
  const int device = q.device().index;
  cuda::DeviceGuard on_device(device);
  const cuda::Stream stream = cuda::current_stream(device);
  if (q.dtype() == DType::f8e4m3) {
    launch_dequantize<F8E4M3Format>(stream, q, scale, out);
  } else {
    launch_dequantize<F8E5M2Format>(stream, q, scale, out);
  }
}

void delayed_update_cuda(const DelayedUpdate& u) {
  const int device = u.history.device().index;
  cuda::DeviceGuard on_device(device);
  const cuda::Stream stream = cuda::current_stream(device);
  delayed_update_kernel<<<1, kThreads, 0, stream.handle()>>>(
      static_cast<float*>(u.history.data_ptr()), u.history.numel(), static_cast<float*>(u.scale.data_ptr()),
      static_cast<float*>(u.scale_inv.data_ptr()), static_cast<const float*>(u.new_amax.data_ptr()),
      static_cast<int64_t*>(u.overflows.data_ptr()), u.most_recent, u.scaled_max, u.saturation_bound);
  MT_CUDA_CHECK_LAUNCH();
}

void current_scale_cuda(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, float scaled_max) {
  const int device = amax.device().index;
  cuda::DeviceGuard on_device(device);
  const cuda::Stream stream = cuda::current_stream(device);
  current_scale_kernel<<<1, 1, 0, stream.handle()>>>(static_cast<const float*>(amax.data_ptr()),
                                                     static_cast<float*>(scale.data_ptr()),
                                                     static_cast<float*>(scale_inv.data_ptr()), scaled_max);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::ops
