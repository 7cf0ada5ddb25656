// The final sum of the norms' parameter gradients (norm_final_sum.cuh): the polled reads of the
// partial rows, sum_groups_kernel, its launcher, and the per-stream PartialRowWorkspace. The
// kernel keeps one order of addition, polled or not, so dweight and dbias do not depend on when
// the rows arrive. Explicitly instantiated for the four floating types the norms dispatch over.
#include <cstdio>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/norm/norm_final_sum.cuh"
#include "ops/norm/norm_warp_rows.cuh"

namespace mt::ops::norm_detail {

namespace {

// v[k] = *at[k] once each word has been written (a null at[k] is skipped and reads 0), each word
// marked unwritten again after it is read. Sleeps between reads, twice as long each time nothing
// arrived (up to kLongestPollNs), so that the reads do not crowd the L2 that the backward's last
// stores go through. If words are still missing after kPollsBeforeWait reads, waits for the
// backward grid to complete: then every word is there. One still marked after that can only have
// been taken by another sum, from work not ordered on one stream (a graph replayed beside work on
// the stream it was captured on); that traps, rather than hang. Other such sharing would mix two
// backwards' rows unnoticed, hence the rule on PartialRowWorkspace.
template <int kN>
__device__ void await_published(float* const (&at)[kN], float (&v)[kN]) {
#pragma unroll
  for (int k = 0; k < kN; ++k) v[k] = at[k] != nullptr ? load_word(at[k]) : 0.0f;
  int sleep_ns = kShortestPollNs;
  for (int poll = 0;; ++poll) {
    bool missing = false, arrived = false;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (at[k] == nullptr || !unwritten(v[k])) continue;
      v[k] = load_word(at[k]);
      if (unwritten(v[k])) {
        missing = true;
      } else {
        arrived = true;
      }
    }
    if (!missing) break;
    if (poll == kPollsBeforeWait) {
      cuda::wait_for_prerequisite_grids();
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        if (at[k] != nullptr && unwritten(v[k])) v[k] = load_word(at[k]);
        if (at[k] != nullptr && unwritten(v[k])) {
          printf(
              "norm backward: a partial row of the parameter gradients was still unwritten after the backward "
              "completed: its stream's workspace was used by work not ordered on that stream\n");
          __trap();
        }
      }
      break;
    }
    sleep_ns = arrived ? kShortestPollNs : min(2 * sleep_ns, kLongestPollNs);
    __nanosleep(sleep_ns);
  }
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    if (at[k] != nullptr) store_word(at[k], __uint_as_float(kUnwrittenBits));
  }
}

// A polled sum ends by waiting for the backward to complete, so that its own completion, which is
// all that the kernel after it waits for, still implies the backward's (dx among its outputs).
__device__ __forceinline__ void finish_polled_sum() { cuda::wait_for_prerequisite_grids(); }

// out[c] = sum over groups of part[g, c], cast to T, for (out, part) = (dweight, dweight_part)
// at blockIdx.y 0 and (dbias, dbias_part) at 1 (one launch for both; a null pair is skipped).
// Block of kFinalThreads over kFinalCols columns: lane l of a warp reads column l % kFinalCols of
// group row (warp * 4 + l / kFinalCols) and every 32nd after it (a warp load is four full
// 32-byte sectors); the four rows of a warp combine by shuffles, the warps through shared
// memory, in a fixed order. Narrow column tiles give a 768-wide norm 192 blocks, each thread a
// few loads deep: 32-column tiles would leave it 48 blocks, 16 loads deep, waiting mostly on
// memory latency.
// With `polled` the partial rows are the warp-per-row backward's workspace (PartialRowWorkspace)
// and that backward may still be running: each word is read until it no longer holds
// kUnwrittenBits, then marked so again. The sums keep the same order either way.
constexpr int kFinalCols = 8;
constexpr int kFinalThreads = 256;
constexpr int kFinalRowsInFlight = 8;  // group rows a thread reads before it adds the first

template <typename T>
__global__ void __launch_bounds__(kFinalThreads)
    sum_groups_kernel(T* dweight, acc_t<T>* dweight_part, T* dbias, acc_t<T>* dbias_part, int64_t groups, int64_t cols,
                      bool polled) {
  using A = acc_t<T>;
  constexpr int kLanes = rowwise::kWarpSize;
  constexpr int kWarps = kFinalThreads / kLanes;
  constexpr int kRowsPerWarp = kLanes / kFinalCols;
  constexpr int kGroupStride = kWarps * kRowsPerWarp;  // 32 group rows in flight per block
  if (polled) {
    cuda::allow_dependent_grids();  // the wait comes last: see finish_polled_sum
  } else {
    start_dependent_kernel();
  }
  T* out = blockIdx.y == 0 ? dweight : dbias;
  A* part = blockIdx.y == 0 ? dweight_part : dbias_part;
  if (out == nullptr) return;  // the whole block: no barrier is skipped by some
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int warp = static_cast<int>(threadIdx.x) / kLanes;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFinalCols + lane % kFinalCols;
  A s = 0;
  if (c < cols) {
    for (int64_t first = warp * kRowsPerWarp + lane / kFinalCols; first < groups;
         first += kFinalRowsInFlight * kGroupStride) {
      A v[kFinalRowsInFlight];
      A* at[kFinalRowsInFlight];
#pragma unroll
      for (int k = 0; k < kFinalRowsInFlight; ++k) {
        const int64_t g = first + k * kGroupStride;
        at[k] = g < groups ? part + g * cols + c : nullptr;
      }
      if constexpr (std::is_same_v<A, float>) {
        if (polled) await_published(at, v);
      }
      if (!polled) {
#pragma unroll
        for (int k = 0; k < kFinalRowsInFlight; ++k) v[k] = at[k] != nullptr ? *at[k] : A(0);
      }
#pragma unroll
      for (int k = 0; k < kFinalRowsInFlight; ++k) {
        if (at[k] != nullptr) s += v[k];  // in the order of the group rows, as they arrived or not
      }
    }
  }
  static_assert(kRowsPerWarp == 4, "two shuffle steps combine a warp's group rows");
  s += __shfl_xor_sync(0xffffffffu, s, kFinalCols);
  s += __shfl_xor_sync(0xffffffffu, s, 2 * kFinalCols);
  __shared__ A by_warp[kWarps][kFinalCols];
  if (lane < kFinalCols) by_warp[warp][lane] = s;
  __syncthreads();
  if (threadIdx.x < kFinalCols && c < cols) {
    A total = by_warp[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total += by_warp[w][threadIdx.x];
    out[c] = convert<T>(total);
  }
  if (polled) finish_polled_sum();
}

}  // namespace

// dweight[c] and dbias[c] = the sums of their partial rows [groups, cols] over the groups, cast
// to T; an undefined gradient is skipped. `polled`: the rows are a PartialRowWorkspace's, which
// the kernel before this one, the warp-per-row backward, is still writing.
template <typename T>
void sum_partial_groups(const Tensor& dweight, acc_t<T>* dweight_rows, const Tensor& dbias, acc_t<T>* dbias_rows,
                        int64_t groups, int64_t cols, bool polled, const cuda::Stream& stream) {
  if (!dweight.defined() && !dbias.defined()) return;
  MT_INTERNAL_ASSERT((!polled || std::is_same_v<acc_t<T>, float>), "polled partial rows are f32");
  const dim3 grid(static_cast<unsigned>((cols + kFinalCols - 1) / kFinalCols), 2);
  cuda::launch_dependent(sum_groups_kernel<T>, grid, dim3(kFinalThreads), 0, stream.handle(), stream.device(),
                         mutable_data_or_null<T>(dweight), dweight.defined() ? dweight_rows : nullptr,
                         mutable_data_or_null<T>(dbias), dbias.defined() ? dbias_rows : nullptr, groups, cols, polled);
}

template void sum_partial_groups<float>(const Tensor&, float*, const Tensor&, float*, int64_t, int64_t, bool,
                                        const cuda::Stream&);
template void sum_partial_groups<double>(const Tensor&, double*, const Tensor&, double*, int64_t, int64_t, bool,
                                         const cuda::Stream&);
template void sum_partial_groups<Half>(const Tensor&, float*, const Tensor&, float*, int64_t, int64_t, bool,
                                       const cuda::Stream&);
template void sum_partial_groups<BFloat16>(const Tensor&, float*, const Tensor&, float*, int64_t, int64_t, bool,
                                           const cuda::Stream&);

PartialRowWorkspace* partial_row_workspace(const cuda::Stream& stream, std::unique_lock<std::mutex>& lease) {
  if (!cuda::dependent_launch_enabled(stream.device())) return nullptr;
  static auto* mutex = new std::mutex();  // never destroyed, like the map it guards
  static auto* spaces = new std::map<std::pair<int, cuda::StreamHandle>, PartialRowWorkspace>();
  PartialRowWorkspace* space = nullptr;
  {
    std::lock_guard<std::mutex> lock(*mutex);
    space = &(*spaces)[std::make_pair(stream.device(), stream.handle())];  // map nodes do not move
  }
  lease = std::unique_lock<std::mutex>(space->in_use);
  if (space->marked) return space;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MT_CUDA_CHECK(cudaStreamIsCapturing(stream.handle(), &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    lease = std::unique_lock<std::mutex>();
    return nullptr;
  }
  if (!space->words.defined()) {
    // mt::empty allocates on current_stream(device), the stream this workspace serves.
    space->words =
        empty({PartialRowWorkspace::kWords}, TensorOptions().dtype(DType::f32).device(cuda_device(stream.device())));
  }
  space->mark(stream);
  return space;
}

}  // namespace mt::ops::norm_detail
