// Internal to ops/norm's CUDA files: the final sum of the parameter gradients and the
// protocol by which it reads the warp-per-row backward's partial rows while that backward still
// writes them. Every norm backward that wants dweight or dbias ends with sum_partial_groups: one
// kernel (norm_final_sum.cu) adds the [groups, C] partial rows per column, in the order of the
// groups, whatever order they arrive in (deterministic, no atomics). Where the dependent launch is
// on, the warp-per-row backward writes its rows into its stream's PartialRowWorkspace, whose every
// word holds kUnwrittenBits between uses, and the sum polls the words (store_word / load_word
// below, the one pair of accesses both kernels make while both run). Invariants: a workspace is
// used by one stream's work only (a graph whose norms use it is replayed on the stream it was
// captured on, or while no other work runs there); its words are all marked whenever no backward
// and sum pair is between its launches (`marked`, and recover() after a failed launch); the
// backward never stores the mark's bit pattern (published()).
#pragma once

#include <cstdint>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda_context.h"
#include "ops/norm/norm_warp_rows.cuh"

namespace mt::ops::norm_detail {

// ---- the parameter gradients' partial rows, read as they are written ----
// The warp-per-row backward's blocks each write one partial row of dweight and one of dbias, and
// sum_groups_kernel adds them up per column. Where the dependent launch is on, those rows live in
// a workspace per (device, stream) (PartialRowWorkspace) whose every word holds kUnwrittenBits
// between uses, so that the final sum, a programmatic dependent of the backward, can start on the
// rows already written instead of waiting for the whole backward grid to complete: a word that no
// longer holds the mark is the partial sum itself (the backward stores it and the sum loads it as
// one relaxed 32-bit access at GPU scope, seen whole or not at all), and the sum marks it again
// once read, before any later backward may write it (that backward waits for this sum). The mark
// is a NaN that the backward never stores: it stores every NaN it summed as 0x7fffffff
// (published).
constexpr uint32_t kUnwrittenBits = 0xffffffffu;
constexpr int kShortestPollNs = 32;   // sleep between reads while the words are arriving
constexpr int kLongestPollNs = 1024;  // ... and the longest, reached while none has come for a while
// Reads before falling back to waiting for the backward grid. The sum starts once every block of
// the backward has a warp past its rows, so this only has to outlast the last rows and the blocks'
// epilogues.
constexpr int kPollsBeforeWait = 4096;

__device__ __forceinline__ float published(float sum) { return isnan(sum) ? __int_as_float(0x7fffffff) : sum; }

__device__ __forceinline__ bool unwritten(float v) { return __float_as_uint(v) == kUnwrittenBits; }

// The words both kernels touch while both run: relaxed accesses at GPU scope (no data race in
// the PTX memory model, and never served by a stale L1 line), under an L2 evict_last policy. The
// workspace is the same 1.6 MB for every norm on the stream, so it is worth keeping in the L2 while
// the rows stream through: without the hint its lines were evicted between uses, written back
// with their marks, and read back from DRAM by the sum's first reads, twice the workspace's size in
// DRAM traffic per backward that no floor counts.
// Not volatile: the policy is a pure value, so the compiler may make it once per thread instead
// of once per access (the sum's reads repeat while it polls).
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ float load_word(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.L2::cache_hint.f32 %0, [%1], %2;"
               : "=f"(v)
               : "l"(p), "l"(l2_evict_last_policy())
               : "memory");
  return v;
}
__device__ __forceinline__ void store_word(float* p, float v) {
  asm volatile("st.relaxed.gpu.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(v), "l"(l2_evict_last_policy())
               : "memory");
}

// The warp-per-row backward's partial rows of dweight and dbias, [kMaxWarpRowGroups, kWarpRowCols]
// each, for the kernels of one (device, stream): every word holds kUnwrittenBits between uses
// (see "read as they are written" above). Made at the first backward of the stream, where the
// dependent launch is on (elsewhere the sum runs after the backward anyway), outside a capture,
// and kept for the process, as the GEMMs' workspace is. A backward captured on a stream that has
// none takes partial rows of its own and a final sum that waits for the backward (GraphStep's
// warm-up runs make the workspace before the capture). So a graph whose norms use it must be
// replayed on the stream it was captured on, or while no other work runs on that stream.
// Reading the rows as they come pays only where the backward lets the sum in after its rows; the
// marks themselves cost some of what reading early gains. Marks rather than flags (one per row
// and final-sum block, set with st.release.gpu after plain stores, read with a fence, cleared by
// their one reader, a far smaller workspace): a release waits on the block's outstanding stores,
// and the reader adds a fence and a trip to the L2 after the last flag, which cost more than the
// marks' larger workspace.
struct PartialRowWorkspace {
  static constexpr int64_t kWords = 2 * kMaxWarpRowGroups * kWarpRowCols;
  Tensor words;         // f32 [kWords]: dweight's rows, then dbias's
  bool marked = false;  // every word holds kUnwrittenBits (or will, by the time the stream gets there)
  std::mutex in_use;    // held from a backward's launch to its sum's: host threads may share a stream
  float* dweight_rows() const { return static_cast<float*>(words.data_ptr()); }
  float* dbias_rows() const { return dweight_rows() + kWords / 2; }

  // Puts the mark in every word, on `stream` (the one this workspace serves).
  void mark(const cuda::Stream& stream) {
    static_assert(kUnwrittenBits == 0xffffffffu, "the mark is every byte 0xff");
    MT_CUDA_CHECK(cudaMemsetAsync(words.data_ptr(), 0xff, kWords * sizeof(float), stream.handle()));
    marked = true;
  }

  // After a backward launched without its sum (the sum's launch threw): its words may stay
  // unmarked, so they are all marked again now, ahead of any later use of the stream (a graph
  // replayed next would read them). Under a capture nothing ran, and the words are as they were.
  void recover(const cuda::Stream& stream) noexcept {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.handle(), &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone) {
      marked = true;
      return;
    }
    try {
      mark(stream);
    } catch (...) {  // marked stays false: the stream's next backward outside a capture marks them
    }
  }
};

// The marked workspace of `stream`, held (`lease` owns its lock); null, and `lease` empty, where
// the dependent launch is off or the stream is being captured without a marked workspace (making
// or marking one would put that into the graph).
PartialRowWorkspace* partial_row_workspace(const cuda::Stream& stream, std::unique_lock<std::mutex>& lease);

// dweight[c] and dbias[c] = the sums of their partial rows [groups, cols] over the groups, cast
// to T; an undefined gradient is skipped. `polled`: the rows are a PartialRowWorkspace's, which
// the kernel before this one, the warp-per-row backward, is still writing.
template <typename T>
void sum_partial_groups(const Tensor& dweight, acc_t<T>* dweight_rows, const Tensor& dbias, acc_t<T>* dbias_rows,
                        int64_t groups, int64_t cols, bool polled, const cuda::Stream& stream);

}  // namespace mt::ops::norm_detail
