// CUDA layer / RMS norm backward: dx, dweight and dbias, each only where wanted, with the
// residual gradient (add_*_norm) added as dx is stored. Rows of up to kWarpRowCols columns (not
// f64) with an input gradient go one warp per row (norm_backward_warp_kernel, the layout of
// norm_warp_rows.cuh), which also sums the parameter gradients in the same pass, each lane over
// its own columns, into one partial row per block. Other rows: one block per row for dx
// (norm_backward_dx_kernel), and the parameter gradients as [groups, C] partial sums over row
// groups (norm_param_partial_kernel, column tiles of 32 threads, so reads are coalesced). Either
// way the final sum (norm_final_sum.cuh) adds the partial rows per column in a fixed order:
// deterministic, no atomics, and the number of partial rows depends on the rows alone. Where
// dependent launch is on, the warp-per-row backward and the final sum are launched as programmatic
// dependents, and the sum reads the partial rows as they are written.
#include <algorithm>
#include <initializer_list>
#include <mutex>
#include <type_traits>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/math.h"
#include "ops/norm/norm_final_sum.cuh"
#include "ops/norm/norm_kernels.h"
#include "ops/norm/norm_launch_plan.h"
#include "ops/norm/norm_warp_rows.cuh"
#include "ops/softmax/block_reduce.cuh"

namespace mt::ops {

namespace norm_detail {
namespace {

constexpr int kColTile = 32;        // columns per parameter-gradient block (threadIdx.x)
constexpr int kRowThreads = 16;     // rows in flight per parameter-gradient block (threadIdx.y)
constexpr int kMaxRowGroups = 256;  // gridDim.y of the partial-sum kernel
// Blocks of the warp-per-row backward: kBackwardRowsPerWarp rows per warp, but at least
// kMinBackwardGroups blocks (fewer rows per warp) while rows / 8 allows, so that fewer rows still
// fill the GPU, and at most kMaxWarpRowGroups. Fewer rows per warp mean more partial rows to write
// and sum, and at GPT-2's shapes more waves of blocks; more rows per warp leave too few blocks to
// fill the GPU.
constexpr int64_t kBackwardRowsPerWarp = 8;
constexpr int64_t kMinBackwardGroups = 256;

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
// (a recomputed block, or the op alone) read its last rows of x last, and those are the likeliest still in L2. A
// backward that runs far from its forward (a training step's) neither gains nor loses by the order.
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
  // The ring's first rows of what may not be read yet, asked of the L2 (as in the forward): the
  // kernel before is then draining, and the memory has room for them.
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
  // rows: the first warp's signal counts for its block). Let in at the start, its blocks would
  // take the SMs' spare room during the rows and poll the partial rows long before any is
  // written, slowing the rows themselves.
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
}  // namespace norm_detail

void norm_backward_cuda(NormKind kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                        const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                        const NormResidualGrad& residual) {
  if (kind == NormKind::layer) {
    norm_detail::launch_backward<NormKind::layer>(dx, dweight, dbias, dy, x, mean, rstd, weight, residual);
  } else {
    norm_detail::launch_backward<NormKind::rms>(dx, dweight, dbias, dy, x, mean, rstd, weight, residual);
  }
}

}  // namespace mt::ops
