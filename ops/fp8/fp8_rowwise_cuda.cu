// CUDA kernels of the FP8 frozen base (ops/fp8/fp8_rowwise.h): the row cast and the byte transpose.
//
// The row cast gives each row one block. A row whose columns come in aligned packs of 8 and fit the
// block's registers (kMaxPacks packs a thread: up to 16,384 columns) is read once: each thread loads
// its packs, the block reduces max |v| over them, and the same registers are scaled, converted and
// stored, 8 bytes a store. Any other row is read twice (the max, then the cast), the second time
// mostly from L2, one element a thread at a time. Padding rows are written as zeros with factor 1.

#include "core/cuda/check.h"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/fp8/fp8_convert.cuh"
#include "ops/fp8/fp8_kernels.h"
#include "ops/fp8/fp8_rowwise_kernels.h"

namespace mt::ops {

namespace {

constexpr int kThreads = 256;
constexpr int kPack = 8;      // elements a thread moves per step: one 8-byte FP8 store
constexpr int kMaxPacks = 8;  // packs a thread keeps in registers: rows of up to 16,384 columns
constexpr int kTile = 64;     // the transpose's tiles: kTile x kTile bytes per block
// Shared tile row pitch in bytes: 4-byte aligned rows, and an odd word count so that neither the
// row-wise writes nor the column-wise reads of a warp meet more than two to a bank.
constexpr int kTilePitch = kTile + 4;

// ---- kernels ----

// The maximum of every thread's m, returned to every thread. Once per block.
__device__ __forceinline__ uint32_t block_max(uint32_t m) {
  __shared__ uint32_t warp_max[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  m = lane < kThreads / 32 ? warp_max[lane] : 0u;
  for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// One row per block, kept in registers: cols a multiple of kPack, at most kPacks * kPack * kThreads;
// x's rows aligned to a pack, out's to 8 bytes, column_scale (or null) to 32 bytes.
template <typename Format, typename T, int kPacks>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const T* __restrict__ x, const float* __restrict__ column_scale, uint8_t* __restrict__ out,
                         float* __restrict__ scale_inv, int64_t rows, int64_t cols, float format_max) {
  const int64_t row = blockIdx.x;
  uint8_t* o = out + row * cols;
  if (row >= rows) {
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * kPack; c < cols; c += kThreads * kPack) {
      *reinterpret_cast<uint2*>(o + c) = make_uint2(0u, 0u);
    }
    if (threadIdx.x == 0) scale_inv[row] = 1.0f;
    return;
  }
  const T* xr = x + row * cols;
  float v[kPacks][kPack];
  uint32_t m = 0;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int64_t c = (static_cast<int64_t>(p) * kThreads + threadIdx.x) * kPack;
    if (c >= cols) continue;
    cuda::load_pack_as<kPack>(xr + c, v[p]);
    if (column_scale != nullptr) {
      float s[kPack];
      cuda::load_pack_as<kPack>(column_scale + c, s);
#pragma unroll
      for (int k = 0; k < kPack; ++k) v[p][k] = scaled(v[p][k], s[k]);
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) m = max(m, abs_bits(v[p][k]));
  }
  const float s = scale_from_amax(bits::u32_to_f32(block_max(m)), format_max, 1.0f);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int64_t c = (static_cast<int64_t>(p) * kThreads + threadIdx.x) * kPack;
    if (c >= cols) continue;
    *reinterpret_cast<uint2*>(o + c) = make_uint2(fp8_word<Format>(v[p], s), fp8_word<Format>(v[p] + 4, s));
  }
  if (threadIdx.x == 0) scale_inv[row] = 1.0f / s;
}

// One row per block, any columns and alignment: the max in one pass over the row, the cast in a second.
template <typename Format, typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_two_pass_kernel(const T* __restrict__ x, const float* __restrict__ column_scale,
                                  uint8_t* __restrict__ out, float* __restrict__ scale_inv, int64_t rows, int64_t cols,
                                  float format_max) {
  const int64_t row = blockIdx.x;
  uint8_t* o = out + row * cols;
  if (row >= rows) {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) o[c] = 0;
    if (threadIdx.x == 0) scale_inv[row] = 1.0f;
    return;
  }
  const T* xr = x + row * cols;
  const auto value = [&](int64_t c) {
    const float v = convert<float>(xr[c]);
    return column_scale != nullptr ? scaled(v, column_scale[c]) : v;
  };
  uint32_t m = 0;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) m = max(m, abs_bits(value(c)));
  const float s = scale_from_amax(bits::u32_to_f32(block_max(m)), format_max, 1.0f);
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) o[c] = Format::from_f32(scaled(value(c), s));
  if (threadIdx.x == 0) scale_inv[row] = 1.0f / s;
}

// in [rows, cols] -> out [cols, rows], one kTile x kTile tile per block: words of 4 bytes read along
// in's rows into shared memory, then words of 4 bytes gathered down its columns and written along
// out's rows. rows and cols multiples of 4, both pointers 4-byte aligned.
__global__ void __launch_bounds__(kThreads)
    transpose_bytes_kernel(const uint8_t* __restrict__ in, uint8_t* __restrict__ out, int64_t rows, int64_t cols) {
  __shared__ __align__(16) uint8_t tile[kTile][kTilePitch];  // [row - r0][col - c0]
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int i = threadIdx.x; i < kTile * (kTile / 4); i += kThreads) {
    const int tr = i / (kTile / 4), tc = (i % (kTile / 4)) * 4;
    const int64_t r = r0 + tr, c = c0 + tc;
    const uint32_t word = r < rows && c < cols ? *reinterpret_cast<const uint32_t*>(in + r * cols + c) : 0u;
    *reinterpret_cast<uint32_t*>(&tile[tr][tc]) = word;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * (kTile / 4); i += kThreads) {
    const int oc = i / (kTile / 4), orow = (i % (kTile / 4)) * 4;  // out row c0 + oc, columns r0 + orow + [0, 4)
    const int64_t c = c0 + oc, r = r0 + orow;
    if (c >= cols || r >= rows) continue;
    const uint32_t word = tile[orow][oc] | (tile[orow + 1][oc] << 8) | (tile[orow + 2][oc] << 16) |
                          (static_cast<uint32_t>(tile[orow + 3][oc]) << 24);
    *reinterpret_cast<uint32_t*>(out + c * rows + r) = word;
  }
}

// ---- launchers ----

template <typename Format, typename T, int kPacks>
void launch_rows_in_registers(const cuda::Stream& stream, const RowCast& c, float format_max) {
  quantize_rows_kernel<Format, T, kPacks><<<static_cast<unsigned>(c.out.size(0)), kThreads, 0, stream.handle()>>>(
      static_cast<const T*>(c.x.data_ptr()),
      c.column_scale.defined() ? static_cast<const float*>(c.column_scale.data_ptr()) : nullptr,
      static_cast<uint8_t*>(c.out.data_ptr()), static_cast<float*>(c.scale_inv.data_ptr()), c.x.size(0), c.x.size(1),
      format_max);
}

template <typename Format, typename T>
void launch_rows(const cuda::Stream& stream, const RowCast& c, float format_max) {
  const int64_t cols = c.x.size(1);
  const void* cs = c.column_scale.defined() ? c.column_scale.data_ptr() : nullptr;
  const int64_t packs = (cols + int64_t{kPack} * kThreads - 1) / (int64_t{kPack} * kThreads);
  const bool in_registers = cols % kPack == 0 && packs <= kMaxPacks &&
                            cuda::aligned_to(c.x.data_ptr(), kPack * sizeof(T)) &&
                            cuda::aligned_to(c.out.data_ptr(), 8) && (cs == nullptr || cuda::aligned_to(cs, 32));
  if (!in_registers) {
    quantize_rows_two_pass_kernel<Format, T><<<static_cast<unsigned>(c.out.size(0)), kThreads, 0, stream.handle()>>>(
        static_cast<const T*>(c.x.data_ptr()), static_cast<const float*>(cs), static_cast<uint8_t*>(c.out.data_ptr()),
        static_cast<float*>(c.scale_inv.data_ptr()), c.x.size(0), cols, format_max);
  } else if (packs <= 1) {
    launch_rows_in_registers<Format, T, 1>(stream, c, format_max);
  } else if (packs == 2) {
    launch_rows_in_registers<Format, T, 2>(stream, c, format_max);
  } else if (packs <= 4) {
    launch_rows_in_registers<Format, T, 4>(stream, c, format_max);
  } else {
    launch_rows_in_registers<Format, T, kMaxPacks>(stream, c, format_max);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---- entry points ----

void quantize_rows_cuda(const RowCast& c) {
  if (c.out.size(0) == 0) return;
  MT_INTERNAL_ASSERT(c.out.size(0) <= int64_t{0x7fffffff}, "quantize_rows_cuda: ", c.out.size(0),
                     " rows, one block each, exceed the grid");
  const int device = c.out.device().index;
  cuda::DeviceGuard on_device(device);
  const cuda::Stream stream = cuda::current_stream(device);
  dispatch_floating(c.x.dtype(), "quantize_fp8_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (c.out.dtype() == DType::f8e4m3) {
      launch_rows<F8E4M3Format, T>(stream, c, 448.0f);
    } else {
      launch_rows<F8E5M2Format, T>(stream, c, 57344.0f);
    }
  });
}

void transpose_bytes_cuda(const Tensor& in, const Tensor& out) {
  const int64_t rows = in.size(0), cols = in.size(1);
  if (rows == 0 || cols == 0) return;
  MT_INTERNAL_ASSERT(rows % 4 == 0 && cols % 4 == 0 && cols <= int64_t{65535} * kTile &&
                         cuda::aligned_to(in.data_ptr(), 4) && cuda::aligned_to(out.data_ptr(), 4),
                     "transpose_bytes_cuda: [", rows, ", ", cols,
                     "] needs sides that are multiples of 4 (at most 65535 tiles across), 4-byte aligned");
  const int device = in.device().index;
  cuda::DeviceGuard on_device(device);
  const cuda::Stream stream = cuda::current_stream(device);
  const dim3 grid(static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>((cols + kTile - 1) / kTile));
  transpose_bytes_kernel<<<grid, kThreads, 0, stream.handle()>>>(static_cast<const uint8_t*>(in.data_ptr()),
                                                                 static_cast<uint8_t*>(out.data_ptr()), rows, cols);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::ops
