// CUDA embedding kernels. Ids are not checked on the host (that would need a
// device-to-host sync); the kernels stay in bounds: an out-of-range id gives a
// NaN row forward and is skipped backward.
//
// The backward is deterministic: the token positions are stably sorted by id
// (CUB's radix sort), so the positions of each id sit together in increasing
// order; one thread per (run of equal ids, column) then adds those rows in that
// order and writes the sum once. No atomics, so repeated ids (a common word
// seen hundreds of times in a batch) always sum in the same order and a run is
// bit-for-bit repeatable.
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/embedding/embedding_kernels.h"

namespace mt::ops {

namespace {

// ---- kernels ----

// out // [N, C], weight // [V, C], ids // [N]; one thread per output element.
template <typename T, typename I>
__global__ void embedding_forward_kernel(T* out, const T* weight, const I* ids, int64_t N, int64_t C, int64_t V) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i - n * C;
    const auto v = static_cast<int64_t>(ids[n]);
    out[i] = (v >= 0 && v < V) ? weight[v * C + c] : convert<T>(__int_as_float(0x7fc00000));  // NaN
  }
}

// The same, a warp per row of packs of kPack elements (16 bytes), for rows of whole packs on
// 16-byte boundaries: the row's id is read once, and no division per element. The element
// kernel's division and id read per element keep it far from the bytes' floor at GPT-2's shapes.
template <typename T, typename I>
__global__ void embedding_forward_rows_kernel(T* out, const T* weight, const I* ids, int64_t N, int64_t C, int64_t V) {
  constexpr int kPack = cuda::pack_size<T>();
  using P = cuda::Pack<T, kPack>;
  constexpr int kLanes = 32;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int64_t warps_per_block = blockDim.x / kLanes;
  const int64_t packs = C / kPack;
  P nan_row;
#pragma unroll
  for (int k = 0; k < kPack; ++k) nan_row.v[k] = convert<T>(__int_as_float(0x7fc00000));
  for (int64_t n = blockIdx.x * warps_per_block + threadIdx.x / kLanes; n < N;
       n += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    const auto v = static_cast<int64_t>(ids[n]);
    P* row = reinterpret_cast<P*>(out + n * C);
    if (v >= 0 && v < V) {
      const P* source = reinterpret_cast<const P*>(weight + v * C);
#pragma unroll 4
      for (int64_t k = lane; k < packs; k += kLanes) row[k] = source[k];
    } else {
      for (int64_t k = lane; k < packs; k += kLanes) row[k] = nan_row;
    }
  }
}

// Positions 0..N-1, the values the sort carries along with the ids.
__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

// grad_weight // [V, C] in A (zeros, or a sum to add into), grad_out // [N, C]; sorted_ids // [N]
// ascending with their positions // [N]. Thread (i, c) works only where a run of equal ids starts
// at i: it sums that run's rows of column c in position order and adds the total once, so that
// a sum added into equals the sum of the zero-filled gradient and that sum bit for bit.
template <typename T, typename A, typename I>
__global__ void embedding_backward_sorted_kernel(A* grad_weight, const T* grad_out, const I* sorted_ids,
                                                 const int32_t* positions, int64_t N, int64_t C, int64_t V) {
  const int64_t total = N * C;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / C, c = k - i * C;
    const I id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // not the start of a run
    const auto v = static_cast<int64_t>(id);
    if (v < 0 || v >= V) continue;
    A sum = 0;
    for (int64_t j = i; j < N && sorted_ids[j] == id; ++j) sum += convert<A>(grad_out[positions[j] * C + c]);
    grad_weight[v * C + c] += sum;
  }
}

// The same sums, a thread per (sorted index, pack of kPack columns), for rows of whole packs on
// their boundaries: each column still adds its run's rows in position order, so the results
// equal the element kernel's bit for bit; one division per pack instead of per element, and each
// access moves kPack elements. A run of one id is still summed by one thread per pack, row after
// row: a token repeated thousands of times in a batch (padding) makes that thread's loop long.
template <typename T, typename A, typename I>
__global__ void embedding_backward_packs_kernel(A* grad_weight, const T* grad_out, const I* sorted_ids,
                                                const int32_t* positions, int64_t N, int64_t C, int64_t V) {
  constexpr int kPack = 4;  // 16 bytes of the f32 sums
  const int64_t packs = C / kPack;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < N * packs;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t / packs, k = t - i * packs;
    const I id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // not the start of a run
    const auto v = static_cast<int64_t>(id);
    if (v < 0 || v >= V) continue;
    cuda::Pack<A, kPack> sum{};
    for (int64_t j = i; j < N && sorted_ids[j] == id; ++j) {
      const cuda::Pack<T, kPack> g =
          *reinterpret_cast<const cuda::Pack<T, kPack>*>(grad_out + positions[j] * C + k * kPack);
#pragma unroll
      for (int e = 0; e < kPack; ++e) sum.v[e] += convert<A>(g.v[e]);
    }
    cuda::Pack<A, kPack>& out = reinterpret_cast<cuda::Pack<A, kPack>*>(grad_weight + v * C)[k];
    const cuda::Pack<A, kPack> before = out;
#pragma unroll
    for (int e = 0; e < kPack; ++e) sum.v[e] = before.v[e] + sum.v[e];
    out = sum;
  }
}

}  // namespace

// ---- launchers / entry points ----

void embedding_forward_cuda(const Tensor& out, const Tensor& weight, const Tensor& ids) {
  const int64_t N = out.size(0), C = out.size(1), V = weight.size(0);
  if (N * C == 0) return;
  const cuda::Stream stream = cuda::current_stream(out.device().index);
  dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
    using I = typename decltype(id_tag)::type;
    dispatch_floating(out.dtype(), "embedding", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto* out_data = static_cast<T*>(out.data_ptr());
      const auto* weight_data = static_cast<const T*>(weight.data_ptr());
      const auto* id_data = static_cast<const I*>(ids.data_ptr());
      constexpr int kPack = cuda::pack_size<T>();
      if (C % kPack == 0 && cuda::aligned_to(out_data, 16) && cuda::aligned_to(weight_data, 16)) {
        constexpr int64_t kRowsPerBlock = cuda::kBlockSize / 32;
        embedding_forward_rows_kernel<T, I>
            <<<cuda::grid_for((N + kRowsPerBlock - 1) / kRowsPerBlock, 1), cuda::kBlockSize, 0, stream.handle()>>>(
                out_data, weight_data, id_data, N, C, V);
      } else {
        embedding_forward_kernel<T, I>
            <<<cuda::grid_for(N * C), cuda::kBlockSize, 0, stream.handle()>>>(out_data, weight_data, id_data, N, C, V);
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void embedding_backward_cuda(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& ids) {
  const int64_t N = grad_out.size(0), C = grad_out.size(1), V = grad_weight.size(0);
  if (N * C == 0) return;
  const cuda::Stream stream = cuda::current_stream(grad_out.device().index);
  dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
    using I = typename decltype(id_tag)::type;
    dispatch_floating(grad_out.dtype(), "embedding", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      MT_INTERNAL_ASSERT(grad_weight.dtype() == dtype_of<A>(), "embedding: accumulation buffer has the wrong dtype");
      MT_CHECK(N <= INT32_MAX, "embedding: ", N, " ids exceed the backward's 32-bit positions");
      const TensorOptions on_device = TensorOptions().device(grad_out.device());
      const Tensor positions = empty({N}, on_device.dtype(DType::i32));
      const Tensor sorted_positions = empty({N}, on_device.dtype(DType::i32));
      const Tensor sorted_ids = empty({N}, on_device.dtype(ids.dtype()));
      iota_kernel<<<cuda::grid_for(N), cuda::kBlockSize, 0, stream.handle()>>>(
          static_cast<int32_t*>(positions.data_ptr()), N);
      MT_CUDA_CHECK_LAUNCH();
      // Every bit of the key: an out-of-range id (negative, or >= V) must not share the low bits of a
      // valid one, or it could split that id's run.
      const int end_bit = static_cast<int>(8 * sizeof(I));
      const auto* keys_in = static_cast<const I*>(ids.data_ptr());
      auto* keys_out = static_cast<I*>(sorted_ids.data_ptr());
      const auto* values_in = static_cast<const int32_t*>(positions.data_ptr());
      auto* values_out = static_cast<int32_t*>(sorted_positions.data_ptr());
      size_t scratch_bytes = 0;
      MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratch_bytes, keys_in, keys_out, values_in, values_out,
                                                    static_cast<int>(N), 0, end_bit, stream.handle()));
      const Tensor scratch = empty({static_cast<int64_t>(scratch_bytes) + 1}, on_device.dtype(DType::u8));
      MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data_ptr(), scratch_bytes, keys_in, keys_out, values_in,
                                                    values_out, static_cast<int>(N), 0, end_bit, stream.handle()));
      auto* grad_weight_data = static_cast<A*>(grad_weight.data_ptr());
      const auto* grad_out_data = static_cast<const T*>(grad_out.data_ptr());
      if (C % 4 == 0 && cuda::aligned_to(grad_weight_data, 4 * sizeof(A)) &&
          cuda::aligned_to(grad_out_data, 4 * sizeof(T))) {
        embedding_backward_packs_kernel<T, A, I><<<cuda::grid_for(N * (C / 4)), cuda::kBlockSize, 0, stream.handle()>>>(
            grad_weight_data, grad_out_data, keys_out, values_out, N, C, V);
      } else {
        embedding_backward_sorted_kernel<T, A, I><<<cuda::grid_for(N * C), cuda::kBlockSize, 0, stream.handle()>>>(
            grad_weight_data, grad_out_data, keys_out, values_out, N, C, V);
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mt::ops
