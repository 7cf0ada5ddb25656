// Internal to ops/norm's CUDA files: what the warp-per-row kernels of the forward
// (norm_forward_cuda.cu) and of the backward (norm_backward_cuda.cu) share, and the dtype
// dispatch of both launchers. A row of at most kWarpRowCols columns (x not f64) goes to one warp
// of a kWarpRowBlock-thread block: lane `lane` holds kPerLane elements of it (8, 24 or 32) in
// registers as f32, in chunk_col's layout, read kVec columns at a time (kPackColumns where every
// operand's rows start on such a pack, else 1). The streamed operands (x, delta, dy, dsum) reach
// the registers through each warp's ring of row slots in dynamic shared memory (RowStream,
// RowRing), which starts with the weight and bias as f32 (ParamsInFlight, param_index's layout).
// Invariants: a lane reads back only the ring slots it copied itself (no barrier); the parameters
// are stored once per block, behind one barrier, before any warp reads them; a kernel launched by
// cuda::launch_dependent waits for the kernel before it (start_dependent_kernel) before its first
// write and before reading anything that kernel may write.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/packed.cuh"
#include "core/dispatch.h"
#include "ops/math.h"
#include "ops/norm/norm_kernels.h"
#include "ops/softmax/block_reduce.cuh"

namespace mt::ops::norm_detail {

constexpr int kMaxPerLane = 32;  // row elements a lane may hold in the warp-per-row kernels
constexpr int64_t kWarpRowCols = rowwise::kWarpSize * kMaxPerLane;  // widest row they take (1024)
constexpr int kWarpRowBlock = 256;          // threads per block of the warp-per-row kernels: 8 rows at a time
constexpr int64_t kMaxWarpRowGroups = 512;  // blocks (parameter-gradient partial rows) of the warp-per-row backward

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
// and two of f32; one element per access costs several times the instructions per byte.
constexpr int kPackColumns = 8;

// Calls fn(std::integral_constant<int, V>, std::bool_constant<kFull>) with V, the columns per
// access: kPackColumns where the operands allow it, else 1; and kFull (in_row) for packed rows of
// exactly kPerLane * 32 columns, whose chunks need no predicates (fewer instructions in kernels
// bound by their issue). V does not depend on y's or dy's dtype, so
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
// chunk is converted before the first store. A test and a branch per chunk would keep each chunk's
// conversion behind the previous chunk's store, in the same registers, which a store releases only
// once it has read them, so that each chunk's stores would wait on the one before.
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
// lane after lane, which removes most of the conflicts.
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
// polled final sum lets it in at once and waits last (norm_final_sum.cuh).
// Launched plainly, a kernel's blocks start only after the last block of the kernel before has
// ended and its memory is flushed; launched this way they start before it ends, and the wait
// returns soon after.
__device__ __forceinline__ void start_dependent_kernel() {
  cuda::wait_for_prerequisite_grids();
  cuda::allow_dependent_grids();
}

// The parameters' way to shared memory in two steps, so that their loads are in flight while a
// kernel issues its first rows' copies: load() reads this thread's columns (threadIdx.x + k *
// kWarpRowBlock of the kPerLane * 32 slots; the warp-per-row kernels' blocks are kWarpRowBlock
// threads) into registers, all loads issued before any is used; store() writes them as f32 in
// param_index's layout (1 and -0 past the row or without the tensor). The caller then waits at a
// barrier before any warp reads them. A loop striding by blockDim.x (a trip count the compiler
// does not know) would make each round's loads wait for the last round's stores, and reading them
// before issuing any copy would leave the rows waiting behind them.
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

}  // namespace mt::ops::norm_detail
