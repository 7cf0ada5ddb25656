// CUDA layer / RMS norm forward, with or without the residual add before it (add_*_norm).
// Rows of up to kWarpRowCols columns (not f64) go one warp per row (norm_forward_warp_kernel, the
// layout of norm_warp_rows.cuh): the row is read once into registers as f32, reduced by shuffles,
// and its statistics and y written in one pass. Other rows go one block per row
// (norm_forward_kernel, block reductions in acc_t, two passes over the row so that the centred
// sum of squares does not cancel). Both write y in x's dtype or, for an f32 x, in a half type
// (rounded once as it is stored), and keep mean (layer norm) and rstd per row in acc_t for the
// backward. Where dependent launch is on (core/cuda/dependent_launch.h: by default, on sm_90 and
// later), the warp-per-row kernel is launched as a programmatic dependent of the kernel before it,
// so that its blocks are waiting on the GPU when that kernel ends.
#include <initializer_list>
#include <type_traits>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/math.h"
#include "ops/norm/norm_kernels.h"
#include "ops/norm/norm_launch_plan.h"
#include "ops/norm/norm_warp_rows.cuh"
#include "ops/softmax/block_reduce.cuh"

namespace mt::ops {

namespace norm_detail {
namespace {

// The residual add of the add_*_norm ops, element by element: x + delta rounded to T, as add()
// stores it (the norm's input, and the sum they return).
template <typename T, typename D>
__device__ __forceinline__ T residual_sum(T x, D delta) {
  return convert<T>(convert<acc_t<T>>(x) + convert<acc_t<T>>(delta));
}

// kVec elements from in[0, kVec) to p (aligned to the pack).
template <int kVec, typename E>
__device__ __forceinline__ void store_chunk(E* __restrict__ p, const E* in) {
  cuda::Pack<E, kVec> pack;
#pragma unroll
  for (int i = 0; i < kVec; ++i) pack.v[i] = in[i];
  *reinterpret_cast<cuda::Pack<E, kVec>*>(p) = pack;
}

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
  // safe before the wait), and its copies after the wait find it there. One row, not the ring's
  // first two: more lines asked for while the kernel before still streams its last rows slow it.
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

}  // namespace
}  // namespace norm_detail

void norm_forward_cuda(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, double eps, const NormResidual& residual) {
  if (kind == NormKind::layer) {
    norm_detail::launch_forward<NormKind::layer>(y, mean, rstd, x, weight, bias, eps, residual);
  } else {
    norm_detail::launch_forward<NormKind::rms>(y, mean, rstd, x, weight, bias, eps, residual);
  }
}

}  // namespace mt::ops
