// CUDA layer / RMS norm. Rows of up to kWarpRowCols columns (not f64) go one warp
// per row, the row held in registers as f32 (read from memory once, reduced by
// shuffles; small rows arrive through a per-warp ring in shared memory, RowStream;
// the weight and bias are read as f32 from shared memory); their backward also sums
// the parameter gradients in the same pass, each lane over its own columns, into
// per-block partial rows. Other rows: one
// block per row for the forward and the input gradient (block reductions in acc_t),
// and the parameter gradients as a [groups, C] buffer of per-block partial sums over
// row groups (column tiles of 32 threads, so reads are coalesced). Either way one
// pass then sums the partial rows per column, in a fixed order; deterministic, no atomics (the
// warp-per-row backward's rows are read as they are written: PartialRowWorkspace). Where dependent
// launch is on (core/cuda/dependent_launch.h; on by default), the warp-per-row kernels and that
// final sum are launched as programmatic dependents (cuda::launch_dependent), so that each one's
// blocks are waiting on the GPU when the kernel before it ends.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/math.h"
#include "ops/norm/norm_kernels.h"
#include "ops/softmax/block_reduce.cuh"

namespace mt::ops {

namespace {

constexpr int kColTile = 32;        // columns per parameter-gradient block (threadIdx.x)
constexpr int kRowThreads = 16;     // rows in flight per parameter-gradient block (threadIdx.y)
constexpr int kMaxRowGroups = 256;  // gridDim.y of the partial-sum kernel
constexpr int kMaxPerLane = 32;     // row elements a lane may hold in the warp-per-row kernels
constexpr int64_t kWarpRowCols = rowwise::kWarpSize * kMaxPerLane;  // widest row they take (1024)
constexpr int kWarpRowBlock = 256;          // threads per block of the warp-per-row kernels: 8 rows at a time
constexpr int64_t kMaxWarpRowGroups = 512;  // blocks (parameter-gradient partial rows) of the warp-per-row backward
// Blocks of the warp-per-row backward: kBackwardRowsPerWarp rows per warp, but at least
// kMinBackwardGroups blocks (fewer rows per warp) while rows / 8 allows, so that fewer rows still
// fill the GPU, and at most kMaxWarpRowGroups. On an H200, [16384, 768] bf16 (op_bench layer_norm,
// ncu): 4 rows per warp (512 blocks, two waves of 2 blocks per SM) took the backward 27.9 us and
// the final sum 4.6 us; 8 rows (256 blocks, one wave) 25.3 and 3.4 us; 16 rows were slower again
// (the op 0.050 against 0.046 ms).
constexpr int64_t kBackwardRowsPerWarp = 8;
constexpr int64_t kMinBackwardGroups = 256;

// The warp-per-row kernels' grid: kWarpRowBlock / 32 rows per block, capped (the kernels loop).
inline unsigned warp_row_grid(int64_t rows) {
  constexpr int64_t kRowsPerBlock = kWarpRowBlock / rowwise::kWarpSize;
  return rowwise::row_grid((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Calls fn(std::integral_constant<int, N>) with the fewest elements per lane, N in {8, 24, 32},
// that hold `cols`: the row lives in registers (and the parameters and staged rows in shared
// memory, padded to N * 32 columns), and every unused slot costs some. 24 is GPT-2
// small's 768 columns, 32 its medium's 1024; more variants would mostly cost compile time.
template <typename Fn>
void dispatch_per_lane(int64_t cols, Fn&& fn) {
  const int64_t needed = (cols + rowwise::kWarpSize - 1) / rowwise::kWarpSize;
  if (needed <= 8) return fn(std::integral_constant<int, 8>{});
  if (needed <= 24) return fn(std::integral_constant<int, 24>{});
  fn(std::integral_constant<int, kMaxPerLane>{});
}

// The columns per access of the warp-per-row kernels when every row of every operand starts on
// a boundary of that many elements (else 1). Eight columns are one 16-byte access of a half type
// and two of f32. In GPT-2's shapes the packs took op_bench's layer_norm (bf16, fwd+bwd) from
// 0.114 to 0.061 ms and add_layer_norm from 0.156 to 0.101 ms.
constexpr int kPackColumns = 8;

// Calls fn(std::integral_constant<int, V>, std::bool_constant<kFull>) with V, the columns per
// access: kPackColumns where the operands allow it, else 1; and kFull (in_row) for packed rows of
// exactly kPerLane * 32 columns, whose chunks need no predicates. On an H200 (op_bench layer_norm,
// bf16 [16384, 768], ncu) kFull took the backward from 12.8M to 9.9M instructions and the forward
// from 8.0M to 6.9M, the op from 0.046 to 0.044 ms. V does not depend on y's or dy's dtype, so
// that a half y and an f32 y of the same x sum the row in the same order when every operand is
// aligned (LayerNorm.CudaHalfOutputEqualsTheCastOfTheF32OutputWithTheSameGradients); a view that
// breaks the alignment takes one element per access, and its sums are in another order.
template <int kPerLane, typename Fn>
void dispatch_vector_width(int64_t cols, std::initializer_list<const Tensor*> operands, Fn&& fn) {
  bool packed = cols % kPackColumns == 0;
  for (const Tensor* t : operands) {
    if (!packed) break;
    if (t->defined()) packed = cuda::aligned_to(t->data_ptr(), kPackColumns * element_size(t->dtype()));
  }
  if (!packed) return fn(std::integral_constant<int, 1>{}, std::false_type{});
  if (cols == kPerLane * rowwise::kWarpSize) return fn(std::integral_constant<int, kPackColumns>{}, std::true_type{});
  fn(std::integral_constant<int, kPackColumns>{}, std::false_type{});
}

// fn(per_lane, vec, full): the warp-per-row kernels' layout of rows of `cols` columns, as the
// integral constants of dispatch_per_lane and dispatch_vector_width.
template <typename Fn>
void dispatch_row_layout(int64_t cols, std::initializer_list<const Tensor*> operands, Fn&& fn) {
  dispatch_per_lane(cols, [&](auto per_lane) {
    dispatch_vector_width<decltype(per_lane)::value>(cols, operands,
                                                     [&](auto vec, auto full) { fn(per_lane, vec, full); });
  });
}

// The residual add of the add_*_norm ops, element by element: x + delta rounded to T, as add()
// stores it (the norm's input, and the sum they return).
template <typename T, typename D>
__device__ __forceinline__ T residual_sum(T x, D delta) {
  return convert<T>(convert<acc_t<T>>(x) + convert<acc_t<T>>(delta));
}

// Lane `lane`'s chunk j of a row in the warp-per-row kernels: columns [chunk_col, + kVec).
// kVec = 1: lane l holds columns l, l + 32, ... (each warp access is 32 adjacent elements);
// kVec > 1: lane l holds packs l, l + 32, ... of kVec adjacent columns, one 16-byte access of
// the narrowest operand each (launch_*_warp_rows checks that the rows allow it).
template <int kVec>
__device__ __forceinline__ int chunk_col(int lane, int j) {
  return (lane + rowwise::kWarpSize * j) * kVec;
}

// Whether lane chunk at column c lies in a row of `cols` columns. kFull: every row is exactly
// kPerLane * 32 columns, known when the kernel is compiled, so that no chunk needs a predicate
// or zeros past the row's end (GPT-2's 768 and 1024 columns; see dispatch_vector_width).
template <bool kFull>
__device__ __forceinline__ bool in_row(int c, int cols) {
  return kFull || c < cols;
}

// kVec elements from in[0, kVec) to p (aligned to the pack).
template <int kVec, typename E>
__device__ __forceinline__ void store_chunk(E* __restrict__ p, const E* in) {
  cuda::Pack<E, kVec> pack;
#pragma unroll
  for (int i = 0; i < kVec; ++i) pack.v[i] = in[i];
  *reinterpret_cast<cuda::Pack<E, kVec>*>(p) = pack;
}

// The chunks of one row at `row` that lie in it (cols is a multiple of kVec), into
// out[kPerLane] as O (E itself, or f32: cuda::load_pack_as, a bf16 one instruction) with zeros
// past the row's end.
template <int kPerLane, int kVec, bool kFull, typename E, typename O>
__device__ __forceinline__ void load_row(const E* __restrict__ row, int lane, int cols, O* out) {
#pragma unroll
  for (int j = 0; j < kPerLane / kVec; ++j) {
    const int c = chunk_col<kVec>(lane, j);
    if (in_row<kFull>(c, cols)) {
      cuda::load_pack_as<kVec>(row + c, out + j * kVec);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[j * kVec + i] = O(0);
    }
  }
}

// A lane's chunks of one row from values[kPerLane] (chunk_col's layout) to `row` as E, and the same
// elements to `also` unless it is null (the backward's ddelta beside dx). When the
// whole of the lane's row takes the paired conversion (cuda::pairs_convertible: one test), every
// chunk is converted before the first store. A test and a branch per chunk had kept each chunk's
// conversion behind the previous chunk's store, in the same registers, which a store releases only
// once it has read them: ncu put the backward's largest stall on the long scoreboard. With this
// and param_index's layout, op_bench layer_norm (bf16 [16384, 768], H200) went from 0.044 to
// 0.043 ms (the backward 24.6 to 23.8 us, the forward 15.5 to 15.0), add_layer_norm from 0.104
// to 0.100 ms.
template <int kPerLane, int kVec, bool kFull, typename E, typename A>
__device__ __forceinline__ void store_row(E* __restrict__ row, E* __restrict__ also, int lane, int cols,
                                          const A* values) {
  if constexpr (cuda::kPairedConversion<E, A, kVec>) {
    if (cuda::pairs_convertible<kPerLane, E>(values)) {
      uint32_t words[kPerLane / 2];
      cuda::convert_pairs<kPerLane, E>(values, words);
#pragma unroll
      for (int j = 0; j < kPerLane / kVec; ++j) {
        const int c = chunk_col<kVec>(lane, j);
        if (!in_row<kFull>(c, cols)) continue;
        cuda::Pack<uint32_t, kVec / 2> pack;
#pragma unroll
        for (int k = 0; k < kVec / 2; ++k) pack.v[k] = words[j * kVec / 2 + k];
        *reinterpret_cast<cuda::Pack<uint32_t, kVec / 2>*>(row + c) = pack;
        if (also != nullptr) *reinterpret_cast<cuda::Pack<uint32_t, kVec / 2>*>(also + c) = pack;
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane / kVec; ++j) {
    const int c = chunk_col<kVec>(lane, j);
    if (!in_row<kFull>(c, cols)) continue;
    cuda::store_pack_from<kVec>(row + c, values + j * kVec);
    if (also != nullptr) cuda::store_pack_from<kVec>(also + c, values + j * kVec);
  }
}

// One streamed operand (x, delta, dy, dsum) of a warp-per-row kernel, read row by row. Staged
// (`stages` > 0, packed layouts): the warp's ring of `stages` row slots in shared memory, which a
// lane fills with its own chunks by cp.async (issue) and reads back (read) once the copy group
// has landed (cuda::wait_async_copies); a lane reads only what it copied, so no barrier is
// needed. Rows on the way cost no registers: a warp keeps `stages` rows in flight while it works
// on one. Unstaged (stages == 0, or one element per access, below cp.async's 16 bytes): read
// from global memory into registers as the row is needed.
template <typename E, int kPerLane, int kVec, bool kFull>
struct RowStream {
  static constexpr bool kCanStage = kVec * sizeof(E) % 16 == 0;
  static constexpr int kSlotElements = kPerLane * rowwise::kWarpSize;  // a slot holds chunk_col's layout
  E* ring = nullptr;                                                   // [stages][kSlotElements] of this warp
  int stages = 0;

  // Takes this stream's slots from the warp's staging area at `cursor` and moves it on.
  __device__ __forceinline__ void place(unsigned char*& cursor, int stage_count) {
    stages = kCanStage ? stage_count : 0;
    ring = reinterpret_cast<E*>(cursor);
    cursor += static_cast<size_t>(stages) * kSlotElements * sizeof(E);
  }
  // Starts copying row `row` (null: none) into slot `slot`.
  __device__ __forceinline__ void issue(int slot, const E* __restrict__ row, int lane, int cols) const {
    if constexpr (kCanStage) {
      if (stages == 0 || row == nullptr) return;
      constexpr int kPerCopy = 16 / sizeof(E);
      E* dst = ring + slot * kSlotElements;
#pragma unroll
      for (int j = 0; j < kPerLane / kVec; ++j) {
        const int c = chunk_col<kVec>(lane, j);
        if (!in_row<kFull>(c, cols)) continue;
#pragma unroll
        for (int k = 0; k < kVec; k += kPerCopy) cuda::copy_async_16(dst + c + k, row + c + k);
      }
    }
  }
  // Row `row`'s chunks into out[kPerLane] as O (load_row): from slot `slot` when staged. Two
  // calls, not one on a selected pointer: a pointer that may be either shared or global memory
  // is read by generic loads, which wait on the long scoreboard like global ones.
  template <typename O>
  __device__ __forceinline__ void read(int slot, const E* __restrict__ row, int lane, int cols, O* out) const {
    if (kCanStage && stages > 0) {
      load_row<kPerLane, kVec, kFull>(ring + slot * kSlotElements, lane, cols, out);
    } else {
      load_row<kPerLane, kVec, kFull>(row, lane, cols, out);
    }
  }
};

// The weight and bias as f32 in shared memory, [kSlotElements] each: 1 and -0 where the norm has
// none, so that every element takes one FMA (x * 1 and x + -0 are x, a -0 included). Filled once per block (a barrier),
// then read per row: a row would otherwise convert both again, element by element.
constexpr int kParamRows = 2;

// Where column c's parameter sits in its shared row. One element per access: at c (lane l reads
// l + 32 j, adjacent words). Packs of kVec > 4 f32 take several 16-byte reads per lane, and in
// column order lane l's would start 32 bytes after lane l - 1's (two-way bank conflicts); so each
// pack is cut into 4-float quarters, and quarter q of the lanes' chunk j lies in one 512-byte run,
// lane after lane. ncu on the bf16 [16384, 768] op: the excess shared-memory wavefronts went from
// 53% to 40% of the forward's, from 27% to 8% of the backward's (the rest was not traced).
template <int kVec>
__device__ __forceinline__ int param_chunk_start(int lane, int j) {  // lane's chunk j (its quarter 0)
  if constexpr (kVec <= 4) {
    return chunk_col<kVec>(lane, j);
  } else {
    return (j * (kVec / 4) * rowwise::kWarpSize + lane) * 4;
  }
}
constexpr int kParamQuarterStride = rowwise::kWarpSize * 4;  // floats from one quarter run to the next

template <int kVec>
__device__ __forceinline__ int param_index(int c) {
  if constexpr (kVec <= 4) {
    return c;
  } else {
    const int pack = c / kVec;
    return param_chunk_start<kVec>(pack % rowwise::kWarpSize, pack / rowwise::kWarpSize) +
           c % kVec / 4 * kParamQuarterStride + c % 4;
  }
}

// Lane `lane`'s chunk j of parameters (kVec of them, chunk_col's) from a shared row laid out by
// param_index: one base register per lane, the rest immediate offsets.
template <int kVec>
__device__ __forceinline__ void load_params(const float* row, int lane, int j, float* out) {
  const float* start = row + param_chunk_start<kVec>(lane, j);
  if constexpr (kVec <= 4) {
    cuda::load_pack_as<kVec>(start, out);
  } else {
#pragma unroll
    for (int q = 0; q < kVec / 4; ++q) cuda::load_pack_as<4>(start + q * kParamQuarterStride, out + 4 * q);
  }
}

// Where every kernel launched by cuda::launch_dependent here starts its real work: waits for
// the kernel before it (the inputs may be its outputs, and the outputs may overwrite memory it
// reads), then lets the next one be scheduled, so that its blocks are resident and waiting when
// this one ends. Only reads of what that kernel cannot write come before it (the backward's), and
// L2 prefetches (cuda::prefetch_to_l2), which read nothing.
// Two kernels differ: the warp-per-row backward lets the next one in only after its rows, and a
// polled final sum lets it in at once and waits last (see "read as they are written" below).
// On an H200 the blocks of one kernel started 0.8 to 1.0 us after the last block of the kernel
// before it had ended (globaltimer stamps, op_bench layer_norm in a CUDA Graph); launched this
// way, two kernels in a graph: 1.9 us before, the wait returning 0.4 us after.
__device__ __forceinline__ void start_dependent_kernel() {
  cuda::wait_for_prerequisite_grids();
  cuda::allow_dependent_grids();
}

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
// epilogues (a few us).
constexpr int kPollsBeforeWait = 4096;

__device__ __forceinline__ float published(float sum) { return isnan(sum) ? __int_as_float(0x7fffffff) : sum; }

__device__ __forceinline__ bool unwritten(float v) { return __float_as_uint(v) == kUnwrittenBits; }

// The words both kernels touch while both run: relaxed accesses at GPU scope (no data race in
// the PTX memory model, and never served by a stale L1 line), under an L2 evict_last policy. The
// workspace is the same 1.6 MB for every norm on the stream, so it is worth keeping in the L2 while
// the rows stream through: without the hint its lines were evicted between uses, written back
// with their marks, and read back from DRAM by the sum's first reads, some 3 MB of DRAM traffic
// per backward that no floor counts. On an H200 (op_bench, bf16 [16384, 768], three rounds of
// alternating processes, copy 4229-4237 GB/s): layer_norm 76.4-77.0% of the copy bandwidth
// against 75.8-76.6% without, add_layer_norm 88.2-88.3% against 87.3-87.4%.
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

// The parameters' way to shared memory in two steps, so that their loads are in flight while a
// kernel issues its first rows' copies: load() reads this thread's columns (threadIdx.x + k *
// kWarpRowBlock of the kPerLane * 32 slots; the warp-per-row kernels' blocks are kWarpRowBlock
// threads) into registers, all loads issued before any is used; store() writes them as f32 in
// param_index's layout (1 and -0 past the row or without the tensor). The caller then waits at a
// barrier before any warp reads them. The kernels had read them in a loop striding by blockDim.x
// (a trip count the compiler does not know, so each round's loads waited for the last round's
// stores) before issuing any copy. On an H200 (op_bench layer_norm, bf16 [16384, 768], two runs
// each way in one call) this took the op from 66.7 and 68.2% of the copy bandwidth to 71.5 and
// 71.7% (dependent launch off), from 71.9 and 73.1% to 75.2 and 75.3% (on); add_layer_norm from
// 80.3-80.5% to 82.3-82.4% (off).
template <typename T, int kPerLane, int kVec>
struct ParamsInFlight {
  static constexpr int kSlot = kPerLane * rowwise::kWarpSize;
  static_assert(kSlot % kWarpRowBlock == 0, "every thread takes the same number of columns");
  static constexpr int kPerThread = kSlot / kWarpRowBlock;
  T w[kPerThread], b[kPerThread];
  __device__ __forceinline__ void load(const T* __restrict__ weight, const T* __restrict__ bias, int cols) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kWarpRowBlock;
      if (c < cols && weight != nullptr) w[k] = weight[c];
      if (c < cols && bias != nullptr) b[k] = bias[c];
    }
  }
  __device__ __forceinline__ void store(float* shared, const T* weight, const T* bias, int cols) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kWarpRowBlock;
      const int at = param_index<kVec>(c);
      shared[at] = c < cols && weight != nullptr ? convert<float>(w[k]) : 1.0f;
      shared[kSlot + at] = c < cols && bias != nullptr ? convert<float>(b[k]) : -0.0f;
    }
  }
};

// The bytes the f32 parameters (ParamsInFlight) take at the start of the dynamic shared memory.
template <int kPerLane>
constexpr size_t kParamBytes = kParamRows* kPerLane* rowwise::kWarpSize * sizeof(float);

// Warp `warp`'s staging ring in the dynamic shared memory `staging`: after the parameters, each
// warp's `stages` slots of the streamed operands, `element_bytes` (their element sizes summed) a
// column.
template <int kPerLane>
__device__ __forceinline__ unsigned char* warp_staging(unsigned char* staging, int warp, int stages,
                                                       size_t element_bytes) {
  constexpr size_t kSlot = static_cast<size_t>(kPerLane) * rowwise::kWarpSize;
  return staging + kParamBytes<kPerLane> + static_cast<size_t>(warp) * stages * kSlot * element_bytes;
}

// The staging ring's bookkeeping for a warp that visits rows first, first + stride, ...: the
// prologue issues the first `stages` rows, one copy group each (fill(k) issues row k's copies
// into slot k); each row then waits for its own group, and once its slot has been read, refill
// issues the row `stages` visits on into that slot.
struct RowRing {
  int stages;  // 0: unstaged (nothing is issued or awaited)
  int slot = 0;
  template <typename Fill>
  __device__ __forceinline__ void prologue(int64_t first, int64_t stride, int64_t rows, Fill&& fill) const {
    for (int k = 0; k < stages; ++k) {
      const int64_t r = first + k * stride;
      if (r < rows) fill(k, r);
      cuda::commit_async_copies();  // also when empty: every row owns one group
    }
  }
  __device__ __forceinline__ void wait() const {
    if (stages > 0) cuda::wait_async_copies(stages - 1);
  }
  template <typename Fill>
  __device__ __forceinline__ void refill(int64_t r, int64_t stride, int64_t rows, Fill&& fill) {
    if (stages == 0) return;
    const int64_t next = r + stages * stride;
    if (next < rows) fill(slot, next);
    cuda::commit_async_copies();
    slot = slot + 1 == stages ? 0 : slot + 1;
  }
};

// The forward of norm_forward_kernel below for rows of at most kPerLane * 32 columns, held in
// registers as f32 (chunk_col's layout) and staged through `stages` row slots per warp in the
// dynamic shared memory (RowStream), after the f32 weight and bias (ParamsInFlight). With a
// delta the row is x + delta, also written to sum.
template <typename T, typename Y, typename D, NormKind kKind, int kPerLane, int kVec, bool kFull>
__global__ void __launch_bounds__(kWarpRowBlock)
    norm_forward_warp_kernel(Y* __restrict__ y, T* __restrict__ sum, acc_t<T>* __restrict__ mean_out,
                             acc_t<T>* __restrict__ rstd_out, const T* __restrict__ x, const D* __restrict__ delta,
                             const T* __restrict__ weight, const T* __restrict__ bias, int64_t rows, int cols,
                             acc_t<T> eps, int stages, bool prefetch_first_row) {
  using A = acc_t<T>;
  static_assert(std::is_same_v<A, float>, "the warp-per-row kernels hold rows as f32");
  constexpr int kLanes = rowwise::kWarpSize;
  constexpr int kWarps = kWarpRowBlock / kLanes;
  constexpr int kChunks = kPerLane / kVec;
  using XRows = RowStream<T, kPerLane, kVec, kFull>;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int warp = static_cast<int>(threadIdx.x) / kLanes;
  // A warp holds only kPerLane elements per lane of a row, so each row's scalar work counts: the
  // means multiply by 1 / cols and rstd is rsqrtf (at most 2 ulp from 1 / sqrt, as PyTorch's
  // CUDA norms take it), where IEEE divisions and the square root each cost a slow-path branch.
  const A inv_cols = A(1) / static_cast<A>(cols);
  extern __shared__ __align__(32) unsigned char staging[];
  float* const params = reinterpret_cast<float*>(staging);  // [kParamRows][kSlotElements]
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  // Launched as a dependent, this block is resident while the kernels before it drain, when the
  // memory has little else to do: the warp's first row is asked of the L2 then (prefetch_to_l2,
  // safe before the wait), and its copies after the wait find it there. On an H200 (op_bench,
  // bf16 [16384, 768], three rounds of alternating processes, copy 4221-4241 GB/s) layer_norm
  // went from 80.3-80.8% of the copy bandwidth to 82.6-83.2%; prefetching the ring's first two
  // rows gave 81.9-82.3% (more lines asked for while the kernel before still streams its last rows).
  if (prefetch_first_row && lane == 0 && first < rows) {
    cuda::prefetch_to_l2(x + first * cols, cols * sizeof(T));
    if (delta != nullptr) cuda::prefetch_to_l2(delta + first * cols, cols * sizeof(D));
  }
  start_dependent_kernel();
  ParamsInFlight<T, kPerLane, kVec> in_flight;  // stored once the first rows' copies are on their way
  in_flight.load(weight, bias, cols);
  XRows x_rows;
  RowStream<D, kPerLane, kVec, kFull> delta_rows;
  static_assert(decltype(delta_rows)::kCanStage == XRows::kCanStage, "one ring for every stream");
  {
    unsigned char* cursor =
        warp_staging<kPerLane>(staging, warp, stages, sizeof(T) + (delta != nullptr ? sizeof(D) : 0));
    x_rows.place(cursor, stages);
    if (delta != nullptr) delta_rows.place(cursor, stages);
  }
  const auto fill = [&](int slot, int64_t r) {
    x_rows.issue(slot, x + r * cols, lane, cols);
    if (delta != nullptr) delta_rows.issue(slot, delta + r * cols, lane, cols);
  };
  RowRing ring{x_rows.stages};
  ring.prologue(first, stride, rows, fill);
  in_flight.store(params, weight, bias, cols);
  __syncthreads();
  for (int64_t r = first; r < rows; r += stride) {
    const int64_t base = r * cols;
    ring.wait();
    A v[kPerLane];  // slots past the row hold 0
    if (delta == nullptr) {
      x_rows.read(ring.slot, x + base, lane, cols, v);
    } else {
      T xs[kPerLane];
      D ds[kPerLane];
      x_rows.read(ring.slot, x + base, lane, cols, xs);
      delta_rows.read(ring.slot, delta + base, lane, cols, ds);  // every load issued before the first store
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = chunk_col<kVec>(lane, j);
        if (!in_row<kFull>(c, cols)) continue;
#pragma unroll
        for (int i = 0; i < kVec; ++i) xs[j * kVec + i] = residual_sum(xs[j * kVec + i], ds[j * kVec + i]);
        store_chunk<kVec>(sum + base + c, xs + j * kVec);
      }
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) v[e] = convert<A>(xs[e]);
    }
    A row_sum = 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) row_sum += v[e];
    A mu = 0;
    if constexpr (kKind == NormKind::layer) mu = rowwise::warp_reduce(row_sum, rowwise::Sum{}) * inv_cols;
    A var = 0;  // the centred sum of squares, as the block kernel takes it
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (!in_row<kFull>(chunk_col<kVec>(lane, j), cols)) continue;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const A d = v[j * kVec + i] - mu;
        var += d * d;
      }
    }
    const A rs = rsqrtf(rowwise::warp_reduce(var, rowwise::Sum{}) * inv_cols + eps);
    if (lane == 0) {
      if constexpr (kKind == NormKind::layer) mean_out[r] = mu;
      rstd_out[r] = rs;
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      A w[kVec], b[kVec];
      load_params<kVec>(params, lane, j, w);  // past the row's end: 1 and -0
      load_params<kVec>(params + XRows::kSlotElements, lane, j, b);
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[j * kVec + i] = (v[j * kVec + i] - mu) * rs * w[i] + b[i];
    }
    store_row<kPerLane, kVec, kFull>(y + base, static_cast<Y*>(nullptr), lane, cols, v);
    // Only now is the slot free: the stores above needed every value read from it, so its reads
    // have completed before the copies that overwrite it are issued.
    ring.refill(r, stride, rows, fill);
  }
}

// a + b, rounded once. nvcc would otherwise fuse a product feeding `a` with this add into one
// FMA (one rounding instead of two), and the residual gradient below must equal the engine's
// separate add of the two gradients bit for bit.
__device__ __forceinline__ float add_unfused(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_unfused(double a, double b) { return __dadd_rn(a, b); }

// The input gradient as stored when the sum output has a gradient dsum: the norm's term rounded
// to T, plus dsum, rounded again: what the engine's sum of the two gradients would store.
template <typename T>
__device__ __forceinline__ T residual_grad(acc_t<T> norm_term, acc_t<T> dsum) {
  return convert<T>(add_unfused(convert<acc_t<T>>(convert<T>(norm_term)), dsum));
}

// The whole backward for rows of at most kPerLane * 32 columns, laid out as in
// norm_forward_warp_kernel: the input gradient of norm_backward_dx_kernel below and, in the same pass over dy and x,
// the parameter gradients' partial sums. A lane owns the same columns in every row it visits, so it sums dy * xhat and
// dy for them in registers; at the end the block's warps are summed through shared memory into row blockIdx.x of
// dweight_part / dbias_part [gridDim.x, cols] (a null one is skipped), which sum_groups_kernel
// then reduces. Deterministic: the grid depends on the rows alone. The residual (see NormResidualGrad) is added as dx
// is stored. `polled`: the partial rows are a PartialRowWorkspace's, which the sum reads while this grid runs.
// The rows are visited last to first (row_at), the reverse of the forward's order: a forward that ran just before
// (a recomputed block, or the op alone) read its last rows of x last, and those are the likeliest still in L2. On an
// H200 (op_bench layer_norm, bf16 [16384, 768], turns in one process, two calls) the op went from 73.5-76.3% of the
// copy bandwidth to 75.2-78.6%, add_layer_norm from 77.6-87.8% to 79.3-89.7%; the graph-replayed GPT-2 step, whose
// norms run far from their forwards, 30.9 and 30.9 ms against 30.8 and 30.9.
template <typename T, typename G, typename D, NormKind kKind, int kPerLane, int kVec, bool kFull>
__global__ void __launch_bounds__(kWarpRowBlock, kPerLane <= 24 ? 2 : 1)
    norm_backward_warp_kernel(T* __restrict__ dx, D* __restrict__ ddelta, acc_t<T>* __restrict__ dweight_part,
                              acc_t<T>* __restrict__ dbias_part, const G* __restrict__ dy, const T* __restrict__ dsum,
                              const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                              const acc_t<T>* __restrict__ rstd, const T* __restrict__ weight, int64_t rows, int cols,
                              int stages, bool x_early, bool polled, bool prefetch_first_rows) {
  const auto row_at = [rows](int64_t visit) { return rows - 1 - visit; };  // see "last to first" above
  using A = acc_t<T>;
  constexpr int kLanes = rowwise::kWarpSize;
  constexpr int kWarps = kWarpRowBlock / kLanes;
  constexpr int kChunks = kPerLane / kVec;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int warp = static_cast<int>(threadIdx.x) / kLanes;
  const A inv_cols = A(1) / static_cast<A>(cols);
  const bool params = dweight_part != nullptr || dbias_part != nullptr;
  using XRows = RowStream<T, kPerLane, kVec, kFull>;
  extern __shared__ __align__(32) unsigned char staging[];
  float* const weights = reinterpret_cast<float*>(staging);  // [kParamRows][kSlotElements]; no bias here
  // Before the wait for the kernel before this one: the weight and, when x_early, the first rows
  // of x. Both are tensors the forward saved, which no kernel may write before this backward (an
  // in-place change to a saved tensor is refused); x_early is false where x is the sum the
  // residual forward wrote, which may be that kernel (a recomputed forward). dy, dsum and the
  // statistics may be its outputs, and dx, ddelta and the partial rows may be memory it reads.
  ParamsInFlight<T, kPerLane, kVec> in_flight;  // stored once the first rows' copies are on their way
  in_flight.load(weight, nullptr, cols);
  RowStream<G, kPerLane, kVec, kFull> dy_rows;
  XRows x_rows, dsum_rows;
  static_assert(decltype(dy_rows)::kCanStage == XRows::kCanStage, "one ring for every stream");
  {
    unsigned char* cursor =
        warp_staging<kPerLane>(staging, warp, stages, sizeof(G) + sizeof(T) + (dsum != nullptr ? sizeof(T) : 0));
    dy_rows.place(cursor, stages);
    x_rows.place(cursor, stages);
    if (dsum != nullptr) dsum_rows.place(cursor, stages);
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  const auto fill = [&](int slot, int64_t r) {
    r = row_at(r);
    dy_rows.issue(slot, dy + r * cols, lane, cols);
    x_rows.issue(slot, x + r * cols, lane, cols);
    if (dsum != nullptr) dsum_rows.issue(slot, dsum + r * cols, lane, cols);
  };
  RowRing ring{dy_rows.stages};
  if (x_early) {  // uncommitted: they join the first row's copy group
    for (int k = 0; k < ring.stages; ++k) {
      if (first + k * stride < rows) x_rows.issue(k, x + row_at(first + k * stride) * cols, lane, cols);
    }
  }
  // The ring's first rows of what may not be read yet, asked of the L2 (as in the forward, whose
  // last rows are then draining): add_layer_norm 89.7-90.2% against 89.2-89.5% with the forward's
  // prefetch alone, layer_norm unchanged (same calls).
  if (prefetch_first_rows && lane == 0) {
    for (int k = 0; k < (ring.stages > 0 ? ring.stages : 1) && first + k * stride < rows; ++k) {
      const int64_t base = row_at(first + k * stride) * cols;
      cuda::prefetch_to_l2(dy + base, cols * sizeof(G));
      if (!x_early) cuda::prefetch_to_l2(x + base, cols * sizeof(T));
      if (dsum != nullptr) cuda::prefetch_to_l2(dsum + base, cols * sizeof(T));
    }
  }
  cuda::wait_for_prerequisite_grids();  // the next kernel is let in after the rows, below
  ring.prologue(first, stride, rows, [&](int slot, int64_t r) {
    r = row_at(r);
    dy_rows.issue(slot, dy + r * cols, lane, cols);
    if (!x_early) x_rows.issue(slot, x + r * cols, lane, cols);
    if (dsum != nullptr) dsum_rows.issue(slot, dsum + r * cols, lane, cols);
  });
  in_flight.store(weights, weight, nullptr, cols);
  __syncthreads();
  A sum_dw[kPerLane], sum_db[kPerLane];  // this lane's columns, over the rows it visits
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) sum_dw[e] = sum_db[e] = A(0);
  // The row statistics one row ahead, so that their loads are not on each row's critical path.
  const auto statistics = [&](int64_t r, A& mu, A& rs) {
    mu = A(0), rs = A(0);
    if (r >= rows) return;
    r = row_at(r);
    if constexpr (kKind == NormKind::layer) mu = mean[r];
    rs = rstd[r];
  };
  A next_mu, next_rs;
  statistics(first, next_mu, next_rs);
  for (int64_t r = first; r < rows; r += stride) {
    const int64_t base = row_at(r) * cols;
    const A mu = next_mu, rs = next_rs;
    statistics(r + stride, next_mu, next_rs);
    ring.wait();
    A g[kPerLane], xhat[kPerLane];
    dy_rows.read(ring.slot, dy + base, lane, cols, g);
    x_rows.read(ring.slot, x + base, lane, cols, xhat);
    A sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (!in_row<kFull>(chunk_col<kVec>(lane, j), cols)) continue;
      A w[kVec];
      load_params<kVec>(weights, lane, j, w);  // 1 without a weight
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const int e = j * kVec + i;
        xhat[e] = (xhat[e] - mu) * rs;
        sum_db[e] += g[e];  // dbias = sum of dy; dweight = sum of dy * xhat
        sum_dw[e] += g[e] * xhat[e];
        g[e] *= w[i];
        sum_g += g[e];
        sum_gx += g[e] * xhat[e];
      }
    }
    A mean_g = 0;
    if constexpr (kKind == NormKind::layer) mean_g = rowwise::warp_reduce(sum_g, rowwise::Sum{}) * inv_cols;
    const A mean_gx = rowwise::warp_reduce(sum_gx, rowwise::Sum{}) * inv_cols;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) g[e] = rs * (g[e] - mean_g - xhat[e] * mean_gx);  // the norm's term
    if (dsum != nullptr) {  // g becomes the stored gradient as f32: residual_grad before its last rounding
      A ds[kPerLane];
      dsum_rows.read(ring.slot, dsum + base, lane, cols, ds);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) g[e] = add_unfused(convert<A>(convert<T>(g[e])), ds[e]);
    }
    // ddelta: dx's value (g rounded to T) in D, which is g rounded to D: D is T (the same
    // elements), or T is f32.
    static_assert(std::is_same_v<T, float> || std::is_same_v<D, T>, "dispatch_residual's pairs");
    if constexpr (std::is_same_v<D, T>) {
      store_row<kPerLane, kVec, kFull>(dx + base, ddelta != nullptr ? ddelta + base : nullptr, lane, cols, g);
    } else {
      store_row<kPerLane, kVec, kFull>(dx + base, static_cast<T*>(nullptr), lane, cols, g);
      if (ddelta != nullptr) store_row<kPerLane, kVec, kFull>(ddelta + base, static_cast<D*>(nullptr), lane, cols, g);
    }
    ring.refill(r, stride, rows, fill);  // after the stores that needed every value of the slot
  }
  // Only now may the next kernel, the final sum, be scheduled (once every block has a warp past its
  // rows: the first warp's signal counts for its block). Let in at the start, its blocks took
  // the SMs' spare room during the rows and read the partial rows long before any was written:
  // on an H200 (op_bench layer_norm, bf16 [16384, 768], turns in one process) 75.0-75.4% of the
  // copy bandwidth against 80.4-80.7% so; with the final sum waiting for this grid instead of
  // reading the rows as they come, 79.3-79.7% at the start and 80.0% here.
  cuda::allow_dependent_grids();
  if (!params) return;  // the same for every thread of the grid: no barrier is skipped by some
  // One [kWarps, kPerLane * 32] tile, used for dweight and then for dbias.
  __shared__ A tile[kWarps][kPerLane * kLanes];
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {  // unrolled, so that the sums stay in registers
    A* out = pass == 0 ? dweight_part : dbias_part;
    if (out == nullptr) continue;  // also the same for every thread
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        tile[warp][chunk_col<kVec>(lane, j) + i] = pass == 0 ? sum_dw[j * kVec + i] : sum_db[j * kVec + i];
      }
    }
    __syncthreads();
    for (int c = static_cast<int>(threadIdx.x); c < cols; c += kWarpRowBlock) {
      A total = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += tile[w][c];
      A* const at = out + static_cast<int64_t>(blockIdx.x) * cols + c;
      if (polled) {
        store_word(at, published(total));
      } else {
        *at = total;  // read by a sum that waits for this grid
      }
    }
    __syncthreads();  // before the next pass overwrites the tile
  }
}

// y is written as Y: x's dtype, or a half type for an f32 x (the next GEMM's input,
// rounded once on the store instead of by a separate cast). With a delta the row is
// x + delta, recomputed in each pass and written to sum in the last.
template <typename T, typename Y, typename D, NormKind kKind>
__global__ void norm_forward_kernel(Y* __restrict__ y, T* __restrict__ sum, acc_t<T>* __restrict__ mean_out,
                                    acc_t<T>* __restrict__ rstd_out, const T* __restrict__ x,
                                    const D* __restrict__ delta, const T* __restrict__ weight,
                                    const T* __restrict__ bias, int64_t rows, int64_t cols, acc_t<T> eps) {
  using A = acc_t<T>;
  __shared__ A scratch[rowwise::kWarpSize];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    const D* dr = delta != nullptr ? delta + r * cols : nullptr;
    auto input = [&](int64_t c) { return dr != nullptr ? residual_sum(xr[c], dr[c]) : xr[c]; };
    Y* yr = y + r * cols;
    A mu = 0;
    if constexpr (kKind == NormKind::layer) {
      A s = 0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += convert<A>(input(c));
      mu = rowwise::block_reduce(s, rowwise::Sum{}, scratch) / static_cast<A>(cols);
    }
    A var = 0;  // two passes: the centred sum of squares does not cancel
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const A d = convert<A>(input(c)) - mu;
      var += d * d;
    }
    var = rowwise::block_reduce(var, rowwise::Sum{}, scratch) / static_cast<A>(cols);
    const A rs = A(1) / math::sqrt(var + eps);
    if (threadIdx.x == 0) {
      if constexpr (kKind == NormKind::layer) mean_out[r] = mu;
      rstd_out[r] = rs;
    }
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const T in = input(c);
      if (dr != nullptr) sum[r * cols + c] = in;
      A v = (convert<A>(in) - mu) * rs;
      if (weight != nullptr) v *= convert<A>(weight[c]);
      if (bias != nullptr) v += convert<A>(bias[c]);
      yr[c] = convert<Y>(v);
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight (RMS: no mean(g) term).
// dy is read as G: x's dtype, or the half type a forward with a half y gave. The residual (see NormResidualGrad) is
// added as dx is stored.
template <typename T, typename G, typename D, NormKind kKind>
__global__ void norm_backward_dx_kernel(T* __restrict__ dx, D* __restrict__ ddelta, const G* __restrict__ dy,
                                        const T* __restrict__ dsum, const T* __restrict__ x,
                                        const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                        const T* __restrict__ weight, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  __shared__ A scratch[rowwise::kWarpSize];
  const A inv_cols = A(1) / static_cast<A>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const G* gr = dy + r * cols;
    const T* xr = x + r * cols;
    T* dr = dx + r * cols;
    const A mu = kKind == NormKind::layer ? mean[r] : A(0);
    const A rs = rstd[r];
    A sum_g = 0, sum_gx = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const A gc = weight != nullptr ? convert<A>(gr[c]) * convert<A>(weight[c]) : convert<A>(gr[c]);
      sum_g += gc;
      sum_gx += gc * ((convert<A>(xr[c]) - mu) * rs);
    }
    A mean_g = 0;
    if constexpr (kKind == NormKind::layer) mean_g = rowwise::block_reduce(sum_g, rowwise::Sum{}, scratch) * inv_cols;
    const A mean_gx = rowwise::block_reduce(sum_gx, rowwise::Sum{}, scratch) * inv_cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const A gc = weight != nullptr ? convert<A>(gr[c]) * convert<A>(weight[c]) : convert<A>(gr[c]);
      const A xhat = (convert<A>(xr[c]) - mu) * rs;
      const A term = rs * (gc - mean_g - xhat * mean_gx);
      const T d = dsum != nullptr ? residual_grad<T>(term, convert<A>(dsum[r * cols + c])) : convert<T>(term);
      dr[c] = d;
      if (ddelta != nullptr) ddelta[r * cols + c] = convert<D>(convert<A>(d));
    }
  }
}

// Block (kColTile, kRowThreads) at (blockIdx.x, blockIdx.y) sums columns
// [blockIdx.x * kColTile, +kColTile) over rows blockIdx.y * kRowThreads + k *
// gridDim.y * kRowThreads (+ threadIdx.y), into dweight_part / dbias_part
// [gridDim.y, cols] at row blockIdx.y. A null partial buffer is skipped.
template <typename T, typename G, NormKind kKind>
__global__ void norm_param_partial_kernel(acc_t<T>* dweight_part, acc_t<T>* dbias_part, const G* dy, const T* x,
                                          const acc_t<T>* mean, const acc_t<T>* rstd, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  __shared__ A sw[kRowThreads][kColTile + 1];
  __shared__ A sb[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  A aw = 0, ab = 0;
  if (c < cols) {
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowThreads + threadIdx.y; r < rows;
         r += static_cast<int64_t>(gridDim.y) * kRowThreads) {
      const A g = convert<A>(dy[r * cols + c]);
      if (dweight_part != nullptr) {
        const A mu = kKind == NormKind::layer ? mean[r] : A(0);
        aw += g * ((convert<A>(x[r * cols + c]) - mu) * rstd[r]);
      }
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int i = 1; i < kRowThreads; ++i) {
      aw += sw[i][threadIdx.x];
      ab += sb[i][threadIdx.x];
    }
    const int64_t at = static_cast<int64_t>(blockIdx.y) * cols + c;
    if (dweight_part != nullptr) dweight_part[at] = aw;
    if (dbias_part != nullptr) dbias_part[at] = ab;
  }
}

// out[c] = sum over groups of part[g, c], cast to T, for (out, part) = (dweight, dweight_part)
// at blockIdx.y 0 and (dbias, dbias_part) at 1 (one launch for both; a null pair is skipped).
// Block of kFinalThreads over kFinalCols columns: lane l of a warp reads column l % kFinalCols of
// group row (warp * 4 + l / kFinalCols) and every 32nd after it (a warp load is four full
// 32-byte sectors); the four rows of a warp combine by shuffles, the warps through shared
// memory, in a fixed order. Narrow column tiles give a 768-wide norm 192 blocks, each thread a
// few loads deep: 32-column tiles left it 48 blocks, 16 loads deep (3.4 us on an H200 for 256
// groups, most of it latency).
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

// fn(tag of T, tag of IO): T is x's type (and the gradients'); IO is y's type in
// forward and dy's in backward: T itself, or Half / BFloat16 when T is float.
template <typename Fn>
void dispatch_norm_io(DType x_dtype, DType io_dtype, const char* name, Fn&& fn) {
  dispatch_floating(x_dtype, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (io_dtype == x_dtype) {
      fn(tag, tag);
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (io_dtype == DType::bf16) return fn(tag, TypeTag<BFloat16>{});
      if (io_dtype == DType::f16) return fn(tag, TypeTag<Half>{});
    }
    MT_INTERNAL_ASSERT(false, "no ", name, " kernel for x ", dtype_name(x_dtype), " with y / dy ",
                       dtype_name(io_dtype));
  });
}

// fn(tag of D): D is the residual tensor t's type (delta in forward, ddelta in backward), T
// itself or IO (a half type beside an f32 T); T when t is undefined (the kernels then get null).
template <typename T, typename IO, typename Fn>
void dispatch_residual(const Tensor& t, Fn&& fn) {
  if (!t.defined() || t.dtype() == dtype_of<T>()) return fn(TypeTag<T>{});
  if constexpr (!std::is_same_v<T, IO>) {
    if (t.dtype() == dtype_of<IO>()) return fn(TypeTag<IO>{});
  }
  MT_INTERNAL_ASSERT(false, "no norm kernel for a residual of ", dtype_name(t.dtype()), " beside ",
                     dtype_name(dtype_of<T>()), " and ", dtype_name(dtype_of<IO>()));
}

// How a staged warp-per-row kernel is launched (RowStream): row slots per warp, dynamic shared
// memory per block, and blocks.
struct StagedLaunch {
  int stages = 0;   // 0: unstaged
  size_t smem = 0;  // bytes per block
  unsigned grid = 0;
};

// Row slots per warp the staged kernels ask for. Two keep the next row in flight while a warp
// works on one; on an H200 three were slower (op_bench layer_norm 0.061 against 0.057 ms: the
// larger rings leave fewer blocks resident). MT_NORM_STAGES (0 to 4; 0: unstaged) overrides it.
// Rows of more bytes than the limits below (all streamed operands together) are not staged: their
// register loads already keep much in flight per warp, and the rings cost resident blocks.
// op_bench on an H200: the bf16 layer_norm's 1.5 + 3 KiB rows went from 0.056 to 0.051 ms staged,
// add_layer_norm's f32-stream 4.5 + 7.5 KiB rows from 0.105 to 0.111 ms. Later, in turns within one
// process: the f32 layer_norm with its backward's 6 KiB rows staged 73.1-73.5% of the copy
// bandwidth against 66.3-66.5%, add_layer_norm with its forward's 4.5 KiB rows staged 88.0-88.1%
// against 89.6-89.7%. Hence a limit per direction.
constexpr size_t kMaxStagedForwardRowBytes = 4096;
constexpr size_t kMaxStagedBackwardRowBytes = 6144;
int wanted_stages() {
  static const int stages = [] {
    const char* text = std::getenv("MT_NORM_STAGES");
    return text != nullptr ? std::clamp(std::atoi(text), 0, 4) : 2;
  }();
  return stages;
}

// What the staged launches need to know of a kernel on a device: its static shared memory, the
// dynamic shared memory it may take so far, the device's limits, and its resident blocks per SM
// by dynamic size. Cached (queried on that device once): these are driver calls, and the norms
// launch often.
struct KernelFacts {
  bool queried = false;
  size_t static_smem = 0;
  size_t allowed_smem = 0;  // cudaFuncAttributeMaxDynamicSharedMemorySize; only ever raised
  int smem_per_block = 0;   // the device's opt-in limit
  int sms = 0;
  std::map<size_t, int> resident_blocks;  // per SM, by dynamic shared memory
};

KernelFacts& facts_of(const void* kernel, int device) {
  static std::map<std::pair<const void*, int>, KernelFacts> known;
  KernelFacts& facts = known[{kernel, device}];
  if (!facts.queried) {
    const cuda::DeviceGuard on_device(device);
    cudaFuncAttributes attributes{};
    MT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    facts.static_smem = attributes.sharedSizeBytes;
    facts.allowed_smem = static_cast<size_t>(attributes.maxDynamicSharedSizeBytes);
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&facts.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&facts.sms, cudaDevAttrMultiProcessorCount, device));
    facts.queried = true;
  }
  return facts;
}

// Resident blocks per SM of `kernel` with `smem` bytes of dynamic shared memory, after letting it
// take that much. The attribute is never lowered: a launch of a size seen before must still fit.
int resident_blocks_per_sm(const void* kernel, int device, KernelFacts& facts, size_t smem) {
  const auto found = facts.resident_blocks.find(smem);
  if (found != facts.resident_blocks.end()) return found->second;
  const cuda::DeviceGuard on_device(device);
  if (smem > facts.allowed_smem) {
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    facts.allowed_smem = smem;
  }
  int per_sm = 0;
  MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpRowBlock, smem));
  facts.resident_blocks.emplace(smem, per_sm);
  return per_sm;
}

// The launch of a warp-per-row kernel whose streamed operands take `row_bytes` per row (each
// padded to kPerLane * 32 elements), after `fixed_smem` bytes of its own (the f32 parameters): as
// many stages as wanted_stages() and the device's shared memory allow without fewer resident blocks
// than the unstaged kernel's registers leave (on an H200 the measured rows lose none; on devices
// with less shared memory per SM the rings would), on at most `blocks` blocks (0: as many as are
// resident at once, every warp looping over rows); unstaged on warp_row_grid(rows) blocks (at most
// `blocks`) when kStageable is false, row_bytes exceeds max_staged_row_bytes (the limit of the
// kernel's direction, above) or no stage fits.
template <bool kStageable>
StagedLaunch plan_staged_launch(const void* kernel, int device, size_t fixed_smem, size_t row_bytes,
                                size_t max_staged_row_bytes, int64_t rows, int64_t blocks) {
  StagedLaunch plan;
  plan.grid = warp_row_grid(rows);
  plan.smem = fixed_smem;
  if (blocks > 0) plan.grid = static_cast<unsigned>(std::min<int64_t>(plan.grid, blocks));
  if constexpr (kStageable) {
    constexpr int kWarps = kWarpRowBlock / rowwise::kWarpSize;
    static std::mutex mutex;
    const std::lock_guard<std::mutex> lock(mutex);
    KernelFacts& facts = facts_of(kernel, device);
    const int64_t room =
        static_cast<int64_t>(facts.smem_per_block) - static_cast<int64_t>(facts.static_smem + fixed_smem);
    const auto staged_smem = [&](int stages) { return fixed_smem + static_cast<size_t>(stages) * kWarps * row_bytes; };
    int stages = row_bytes > max_staged_row_bytes || room <= 0
                     ? 0
                     : static_cast<int>(std::min<int64_t>(wanted_stages(), room / (kWarps * row_bytes)));
    if (stages > 0) {
      const int unstaged = resident_blocks_per_sm(kernel, device, facts, fixed_smem);
      while (stages > 0 && resident_blocks_per_sm(kernel, device, facts, staged_smem(stages)) < unstaged) --stages;
    }
    if (stages == 0) return plan;
    plan.stages = stages;
    plan.smem = staged_smem(stages);
    const int64_t resident = std::max<int64_t>(
        1, static_cast<int64_t>(resident_blocks_per_sm(kernel, device, facts, plan.smem)) * facts.sms);
    if (blocks == 0) plan.grid = static_cast<unsigned>(std::min<int64_t>(plan.grid, resident));
  } else {
    (void)kernel, (void)device, (void)row_bytes, (void)max_staged_row_bytes;
  }
  return plan;
}

// Launches the warp-per-row forward when it takes the rows (at most kWarpRowCols columns, not
// f64: twice the registers per element, and those rows are no hot path); returns whether it did.
template <typename T, typename Y, typename D, NormKind kKind>
bool launch_forward_warp_rows(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                              const Tensor& weight, const Tensor& bias, double eps, const NormResidual& residual,
                              const cuda::Stream& stream) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    using A = acc_t<T>;
    const int64_t rows = x.shape()[0], cols = x.shape()[1];
    if (cols > kWarpRowCols) return false;
    const std::initializer_list<const Tensor*> operands = {&y, &x, &weight, &bias, &residual.sum, &residual.delta};
    dispatch_row_layout(cols, operands, [&](auto per_lane, auto vec, auto full) {
      constexpr int kPerLane = decltype(per_lane)::value, kVec = decltype(vec)::value;
      constexpr bool kFull = decltype(full)::value;
      const auto kernel = norm_forward_warp_kernel<T, Y, D, kKind, kPerLane, kVec, kFull>;
      using XRows = RowStream<T, kPerLane, kVec, kFull>;
      const size_t row_bytes = XRows::kSlotElements * (sizeof(T) + (residual.delta.defined() ? sizeof(D) : 0));
      const StagedLaunch plan =
          plan_staged_launch<XRows::kCanStage>(reinterpret_cast<const void*>(kernel), x.device().index,
                                               kParamBytes<kPerLane>, row_bytes, kMaxStagedForwardRowBytes, rows, 0);
      cuda::launch_dependent(kernel, dim3(plan.grid), dim3(kWarpRowBlock), plan.smem, stream.handle(), stream.device(),
                             static_cast<Y*>(y.data_ptr()), mutable_data_or_null<T>(residual.sum),
                             mutable_data_or_null<A>(mean), static_cast<A*>(rstd.data_ptr()),
                             static_cast<const T*>(x.data_ptr()), data_or_null<D>(residual.delta),
                             data_or_null<T>(weight), data_or_null<T>(bias), rows, static_cast<int>(cols),
                             static_cast<A>(eps), plan.stages,
                             /*prefetch_first_row=*/cuda::dependent_launch_enabled(stream.device()));
    });
    return true;
  }
}

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

// The warp-per-row backward's partial rows of dweight and dbias, [kMaxWarpRowGroups, kWarpRowCols]
// each, for the kernels of one (device, stream): every word holds kUnwrittenBits between uses
// (see "read as they are written" above). Made at the first backward of the stream, where the
// dependent launch is on (elsewhere the sum runs after the backward anyway), outside a capture,
// and kept for the process, as the GEMMs' workspace is. A backward captured on a stream that has
// none takes partial rows of its own and a final sum that waits for the backward (GraphStep's
// warm-up runs make the workspace before the capture). So a graph whose norms use it must be
// replayed on the stream it was captured on, or while no other work runs on that stream.
// On an H200 (op_bench, bf16 [16384, 768], turns in one process; the backward letting the sum in
// after its rows): layer_norm 80.7% of the copy bandwidth in one call and 80.3-80.6% in another
// with the rows read as they come, against 80.0% with the sum waiting for the backward grid (and
// 79.3-79.7% as before, the backward letting the sum in at its start). With the backward letting
// it in at its start, the rows in the workspace but awaited so gave 77.7% against 79.4-79.7%: the
// marks cost some of what reading early gains. add_layer_norm 88.9% against 89.2% waiting.
// Flags in place of the marks (one per row and final-sum block, set with st.release.gpu after
// plain stores, read with a fence, cleared by their one reader: 200 KB against the marks' 1.6 MB)
// gave 72.3-73.0% against 79.6-80.5% in alternating processes: the release waits on the block's
// outstanding stores and the reader adds a fence and a trip to the L2 after the last flag.
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

// The warp-per-row backward when it takes the rows (as launch_forward_warp_rows, and only with
// an input gradient: x and the statistics are there then): dx, and dweight / dbias when wanted
// from the same pass, through per-block partial sums; returns whether it did.
template <typename T, typename G, typename D, NormKind kKind>
bool launch_backward_warp_rows(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                               const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                               const NormResidualGrad& residual, const cuda::Stream& stream) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    using A = acc_t<T>;
    const int64_t rows = dy.shape()[0], cols = dy.shape()[1];
    if (cols > kWarpRowCols || !dx.defined() || rows == 0) return false;
    // Each block's partial row costs a write and a read of `cols` sums, and a warp with more rows
    // keeps its ring busy longer (kBackwardRowsPerWarp). The count depends on the rows alone (not
    // on the device or the staging), so the sums' order does too.
    constexpr int64_t kWarps = kWarpRowBlock / rowwise::kWarpSize;
    const int64_t by_rows_per_warp = (rows + kWarps * kBackwardRowsPerWarp - 1) / (kWarps * kBackwardRowsPerWarp);
    const int64_t groups = std::min<int64_t>(
        std::max<int64_t>(by_rows_per_warp, std::min<int64_t>(warp_row_grid(rows), kMinBackwardGroups)),
        kMaxWarpRowGroups);
    // The partial rows [groups, C]: the stream's workspace, or where it has none (a capture), rows of their own.
    std::unique_lock<std::mutex> lease;
    PartialRowWorkspace* const workspace =
        dweight.defined() || dbias.defined() ? partial_row_workspace(stream, lease) : nullptr;
    const TensorOptions acc = TensorOptions().dtype(dtype_of<A>()).device(dy.device());
    const Tensor dw_part = dweight.defined() && workspace == nullptr ? empty({groups, cols}, acc) : Tensor();
    const Tensor db_part = dbias.defined() && workspace == nullptr ? empty({groups, cols}, acc) : Tensor();
    A* const dw_rows = !dweight.defined()     ? nullptr
                       : workspace != nullptr ? workspace->dweight_rows()
                                              : static_cast<A*>(dw_part.data_ptr());
    A* const db_rows = !dbias.defined()       ? nullptr
                       : workspace != nullptr ? workspace->dbias_rows()
                                              : static_cast<A*>(db_part.data_ptr());
    if (workspace != nullptr) workspace->marked = false;  // until the sum that marks the rows again is launched
    try {
      // x may be read before the kernel before this one has ended unless it is the residual
      // forward's sum (see the kernel).
      const bool x_early = !residual.dsum.defined();
      const std::initializer_list<const Tensor*> operands = {&dx, &dy, &x, &weight, &residual.dsum, &residual.ddelta};
      dispatch_row_layout(cols, operands, [&](auto per_lane, auto vec, auto full) {
        constexpr int kPerLane = decltype(per_lane)::value, kVec = decltype(vec)::value;
        constexpr bool kFull = decltype(full)::value;
        const auto kernel = norm_backward_warp_kernel<T, G, D, kKind, kPerLane, kVec, kFull>;
        using XRows = RowStream<T, kPerLane, kVec, kFull>;
        const size_t row_bytes =
            XRows::kSlotElements * (sizeof(G) + sizeof(T) + (residual.dsum.defined() ? sizeof(T) : 0));
        const StagedLaunch plan = plan_staged_launch<XRows::kCanStage>(
            reinterpret_cast<const void*>(kernel), dy.device().index, kParamBytes<kPerLane>, row_bytes,
            kMaxStagedBackwardRowBytes, rows, groups);
        // One partial row per block, every one of them summed (and, polled, awaited).
        MT_INTERNAL_ASSERT(plan.grid == groups, "norm backward: ", plan.grid, " blocks for ", groups, " partial rows");
        cuda::launch_dependent(
            kernel, dim3(plan.grid), dim3(kWarpRowBlock), plan.smem, stream.handle(), stream.device(),
            static_cast<T*>(dx.data_ptr()), mutable_data_or_null<D>(residual.ddelta), dw_rows, db_rows,
            static_cast<const G*>(dy.data_ptr()), data_or_null<T>(residual.dsum), static_cast<const T*>(x.data_ptr()),
            data_or_null<A>(mean), static_cast<const A*>(rstd.data_ptr()), data_or_null<T>(weight), rows,
            static_cast<int>(cols), plan.stages, x_early, /*polled=*/workspace != nullptr,
            /*prefetch_first_rows=*/cuda::dependent_launch_enabled(stream.device()));
      });
      sum_partial_groups<T>(dweight, dw_rows, dbias, db_rows, groups, cols, /*polled=*/workspace != nullptr, stream);
    } catch (...) {
      if (workspace != nullptr) workspace->recover(stream);
      throw;
    }
    if (workspace != nullptr) workspace->marked = true;
    return true;
  }
}

template <NormKind kKind>
void launch_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                    const Tensor& bias, double eps, const NormResidual& residual) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  if (rows == 0) return;
  const cuda::Stream stream = cuda::current_stream(x.device().index);
  dispatch_norm_io(x.dtype(), y.dtype(), name_of(kKind), [&](auto tag, auto io_tag) {
    using T = typename decltype(tag)::type;
    using Y = typename decltype(io_tag)::type;
    using A = acc_t<T>;
    dispatch_residual<T, Y>(residual.delta, [&](auto delta_tag) {
      using D = typename decltype(delta_tag)::type;
      if (!launch_forward_warp_rows<T, Y, D, kKind>(y, mean, rstd, x, weight, bias, eps, residual, stream)) {
        norm_forward_kernel<T, Y, D, kKind>
            <<<rowwise::row_grid(rows), rowwise::row_block_threads(cols), 0, stream.handle()>>>(
                static_cast<Y*>(y.data_ptr()), mutable_data_or_null<T>(residual.sum), mutable_data_or_null<A>(mean),
                static_cast<A*>(rstd.data_ptr()), static_cast<const T*>(x.data_ptr()), data_or_null<D>(residual.delta),
                data_or_null<T>(weight), data_or_null<T>(bias), rows, cols, static_cast<A>(eps));
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

template <NormKind kKind>
void launch_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& mean, const Tensor& rstd, const Tensor& weight, const NormResidualGrad& residual) {
  const int64_t rows = dy.shape()[0], cols = dy.shape()[1];
  const cuda::Stream stream = cuda::current_stream(dy.device().index);
  // The gradients have x's dtype (x itself is not saved when only dbias is wanted).
  const Tensor& any_grad = dx.defined() ? dx : dweight.defined() ? dweight : dbias;
  if (!any_grad.defined()) return;
  dispatch_norm_io(any_grad.dtype(), dy.dtype(), name_of(kKind), [&](auto tag, auto io_tag) {
    using T = typename decltype(tag)::type;
    using G = typename decltype(io_tag)::type;
    using A = acc_t<T>;
    bool done = false;
    dispatch_residual<T, G>(residual.ddelta, [&](auto delta_tag) {
      using D = typename decltype(delta_tag)::type;
      done = launch_backward_warp_rows<T, G, D, kKind>(dx, dweight, dbias, dy, x, mean, rstd, weight, residual, stream);
      if (done || !dx.defined() || rows == 0) return;
      norm_backward_dx_kernel<T, G, D, kKind>
          <<<rowwise::row_grid(rows), rowwise::row_block_threads(cols), 0, stream.handle()>>>(
              static_cast<T*>(dx.data_ptr()), mutable_data_or_null<D>(residual.ddelta),
              static_cast<const G*>(dy.data_ptr()), data_or_null<T>(residual.dsum), static_cast<const T*>(x.data_ptr()),
              data_or_null<A>(mean), static_cast<const A*>(rstd.data_ptr()), data_or_null<T>(weight), rows, cols);
      MT_CUDA_CHECK_LAUNCH();
    });
    if (done) return;
    if (!dweight.defined() && !dbias.defined()) return;
    // At least 4 rows per thread before another row group is worth a block.
    const int64_t wanted = (rows + 4 * kRowThreads - 1) / (4 * kRowThreads);
    const int64_t groups = std::clamp<int64_t>(wanted, 1, kMaxRowGroups);
    const TensorOptions acc = TensorOptions().dtype(dtype_of<A>()).device(dy.device());
    const Tensor dw_part = dweight.defined() ? empty({groups, cols}, acc) : Tensor();  // [groups, C]
    const Tensor db_part = dbias.defined() ? empty({groups, cols}, acc) : Tensor();    // [groups, C]
    const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(groups));
    const dim3 block(kColTile, kRowThreads);
    norm_param_partial_kernel<T, G, kKind><<<grid, block, 0, stream.handle()>>>(
        mutable_data_or_null<A>(dw_part), mutable_data_or_null<A>(db_part), static_cast<const G*>(dy.data_ptr()),
        data_or_null<T>(x), data_or_null<A>(mean), data_or_null<A>(rstd), rows, cols);
    MT_CUDA_CHECK_LAUNCH();
    sum_partial_groups<T>(dweight, mutable_data_or_null<A>(dw_part), dbias, mutable_data_or_null<A>(db_part), groups,
                          cols, /*polled=*/false, stream);
  });
}

}  // namespace

void norm_forward_cuda(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, double eps, const NormResidual& residual) {
  if (kind == NormKind::layer) {
    launch_forward<NormKind::layer>(y, mean, rstd, x, weight, bias, eps, residual);
  } else {
    launch_forward<NormKind::rms>(y, mean, rstd, x, weight, bias, eps, residual);
  }
}

void norm_backward_cuda(NormKind kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                        const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                        const NormResidualGrad& residual) {
  if (kind == NormKind::layer) {
    launch_backward<NormKind::layer>(dx, dweight, dbias, dy, x, mean, rstd, weight, residual);
  } else {
    launch_backward<NormKind::rms>(dx, dweight, dbias, dy, x, mean, rstd, weight, residual);
  }
}

}  // namespace mt::ops
