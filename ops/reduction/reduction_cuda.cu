// Two layouts, two kernels, both deterministic (a fixed combine order, no atomics):
//  - columns: the kept elements are contiguous and the reduced ones one stride
//    apart (a sum over the leading dims: bias gradients, sum_to of a broadcast).
//    Threads of a warp take adjacent columns so every read is coalesced; row
//    groups go to separate blocks, writing [groups, cols] partials in acc_t that
//    a second launch sums. One block per output column would read with a stride
//    of a whole row, a memory sector for every element, many times the bytes a
//    bias gradient needs. Where the rows allow it (16-byte aligned, columns and row stride
//    multiples of a pack) a thread reads 16 bytes of adjacent columns at a time
//    (the packed kernel, the same sums in the same order), else one element.
//  - rows: a contiguous input whose few outputs each reduce a long run of
//    consecutive elements (a loss's mean): each row split over several blocks,
//    writing [outer, splits] partials that a second launch reduces.
//  - anything else: one block per output element; threads stride over the
//    reduced elements and combine through shared memory.
#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "core/strided.h"
#include "ops/cuda/map_impl.cuh"
#include "ops/reduction/reducers.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt::ops {

namespace {

constexpr int kReduceThreads = 256;
constexpr int kColTile = 32;    // columns per block of the column kernel (threadIdx.x)
constexpr int kRowThreads = 8;  // rows in flight per block (threadIdx.y)
constexpr int64_t kMinRowsPerGroup = 64;
constexpr int64_t kTargetBlocks = 1024;  // enough to fill an H100/H200 several times over

// out[c] = reduce over r < rows of in[r * row_stride + c], c < cols, over the rows
// [blockIdx.y * rows_per_group, +rows_per_group) of one row group: `out` is
// [gridDim.y, cols] (partials, or the result when there is one group).
template <typename In, typename Out, typename A>
__global__ void reduce_columns_kernel(Out* out, const In* in, int64_t cols, int64_t rows, int64_t row_stride,
                                      int64_t rows_per_group, ReduceKind kind) {
  __shared__ A tile[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t last = first + rows_per_group < rows ? first + rows_per_group : rows;
  A acc = reduce_identity<A>(kind);
  if (c < cols) {
    for (int64_t r = first + threadIdx.y; r < last; r += kRowThreads) {
      acc = reduce_combine(kind, acc, convert<A>(in[r * row_stride + c]));
    }
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int i = 1; i < kRowThreads; ++i) acc = reduce_combine(kind, acc, tile[i][threadIdx.x]);
    out[static_cast<int64_t>(blockIdx.y) * cols + c] = convert<Out>(acc);
  }
}

// reduce_columns_kernel with kVec adjacent columns per thread, read as one 16-byte pack: thread
// (x, y) of block (bx, by) takes columns [(bx * kColTile + x) * kVec, +kVec) over the rows of
// group by that are y modulo kRowThreads, and the kRowThreads partial values of a column are
// then combined in the order of y, as in reduce_columns_kernel: the two kernels give the same
// bits. Needs cols and row_stride to be multiples of kVec and `in` aligned to 16 bytes.
constexpr int kUnrollRows = 8;  // row loads a thread keeps in flight

template <typename In, typename Out, typename A, int kVec>
__global__ void reduce_columns_packed_kernel(Out* out, const In* in, int64_t cols, int64_t rows, int64_t row_stride,
                                             int64_t rows_per_group, ReduceKind kind) {
  __shared__ A tile[kRowThreads][kVec * kColTile];  // [y][i * kColTile + x]: no bank conflicts
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x) * kVec;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t last = first + rows_per_group < rows ? first + rows_per_group : rows;
  A acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = reduce_identity<A>(kind);
  if (c < cols) {
#pragma unroll kUnrollRows
    for (int64_t r = first + threadIdx.y; r < last; r += kRowThreads) {
      A v[kVec];
      cuda::load_pack_as<kVec>(in + r * row_stride + c, v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = reduce_combine(kind, acc[i], v[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) tile[threadIdx.y][i * kColTile + threadIdx.x] = acc[i];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      A total = acc[i];
      for (int y = 1; y < kRowThreads; ++y) total = reduce_combine(kind, total, tile[y][i * kColTile + threadIdx.x]);
      out[static_cast<int64_t>(blockIdx.y) * cols + c + i] = convert<Out>(total);
    }
  }
}

// The kReduceThreads threads' values combined in a fixed tree order through `partial`
// (shared, kReduceThreads long); every thread gets the result.
template <typename A>
__device__ __forceinline__ A combine_block(A acc, A* partial, ReduceKind kind) {
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kReduceThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width)
      partial[threadIdx.x] = reduce_combine(kind, partial[threadIdx.x], partial[threadIdx.x + width]);
    __syncthreads();
  }
  return partial[0];
}

// out[o * gridDim.x + s] = reduce of in[o * inner + i] over i in split s of row o = blockIdx.y:
// [s * per_split, +per_split) (blockIdx.x = s). No index arithmetic per element.
template <typename In, typename Out, typename A>
__global__ void reduce_rows_kernel(Out* out, const In* in, int64_t inner, int64_t per_split, ReduceKind kind) {
  __shared__ A partial[kReduceThreads];
  const In* row = in + static_cast<int64_t>(blockIdx.y) * inner;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * per_split;
  const int64_t end = begin + per_split < inner ? begin + per_split : inner;
  A acc = reduce_identity<A>(kind);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc = reduce_combine(kind, acc, convert<A>(row[i]));
  acc = combine_block(acc, partial, kind);
  if (threadIdx.x == 0) out[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = convert<Out>(acc);
}

template <typename T>
__global__ void reduce_kernel(T* out, StridedIndexer oi, const T* in, StridedIndexer ii, int64_t outer, int64_t inner,
                              ReduceKind kind) {
  using A = acc_t<T>;
  __shared__ A partial[kReduceThreads];
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
    A acc = reduce_identity<A>(kind);
    for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
      acc = reduce_combine(kind, acc, convert<A>(in[ii.offset(o * inner + i)]));
    }
    acc = combine_block(acc, partial, kind);
    if (threadIdx.x == 0) out[oi.offset(o)] = convert<T>(acc);
    __syncthreads();  // before the next output's values overwrite `partial`
  }
}

// When `in` (kept dims first, then reduced ones) has its kept elements at unit
// stride and its reduced elements one stride apart, that stride (0 for an
// expanded input read again and again); else -1.
int64_t column_row_stride(const Tensor& in, int64_t outer, int64_t inner) {
  if (outer < 2 || inner < 2) return -1;
  // The kept dims are the leading ones whose sizes multiply to `outer` (size-1
  // dims may fall on either side: they carry no stride).
  size_t split = 0;
  for (int64_t product = 1; split < in.shape().size() && product < outer; ++split) product *= in.shape()[split];
  const Shape& shape = in.shape();
  const Shape& strides = in.strides();
  const StridedIndexer kept(Shape(shape.begin(), shape.begin() + split),
                            Shape(strides.begin(), strides.begin() + split));
  const StridedIndexer reduced(Shape(shape.begin() + split, shape.end()),
                               Shape(strides.begin() + split, strides.end()));
  if (kept.ndim != 1 || kept.strides[0] != 1 || kept.sizes[0] != outer) return -1;
  if (reduced.ndim != 1 || reduced.sizes[0] != inner || reduced.strides[0] < 0) return -1;
  return reduced.strides[0];
}

// Whether the packed column kernel reads `in` (kVec columns per 16-byte read).
template <typename In>
bool packed_columns(const In* in, int64_t cols, int64_t row_stride) {
  constexpr int kVec = cuda::pack_size<In>();
  return kVec > 1 && cols % kVec == 0 && row_stride % kVec == 0 && cuda::aligned_to(in, 16);
}

// One launch of the column kernel (packed where packed_columns) over `groups` row groups.
template <typename In, typename Out, typename A>
void launch_reduce_columns(Out* out, const In* in, int64_t cols, int64_t rows, int64_t row_stride, int64_t groups,
                           ReduceKind kind, const cuda::Stream& stream) {
  constexpr int kVec = cuda::pack_size<In>();
  const int64_t rows_per_group = (rows + groups - 1) / groups;
  const dim3 block(kColTile, kRowThreads);
  if (packed_columns(in, cols, row_stride)) {
    const int64_t col_blocks = (cols / kVec + kColTile - 1) / kColTile;
    reduce_columns_packed_kernel<In, Out, A, kVec>
        <<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(groups)), block, 0, stream.handle()>>>(
            out, in, cols, rows, row_stride, rows_per_group, kind);
  } else {
    const int64_t col_blocks = (cols + kColTile - 1) / kColTile;
    reduce_columns_kernel<In, Out, A>
        <<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(groups)), block, 0, stream.handle()>>>(
            out, in, cols, rows, row_stride, rows_per_group, kind);
  }
  MT_CUDA_CHECK_LAUNCH();
}

// Column sums (or maxima) of `in` into `dst`, in T or, for a half T, in acc_t<T> (a bias gradient
// kept in f32). With enough rows, row groups first ([groups, cols] partials in acc_t), then one
// group over the partials. About kTargetBlocks blocks for the first launch, each group at least
// kMinRowsPerGroup rows, or kMinPackedRowsPerGroup for the packed kernel: its threads keep
// kUnrollRows 16-byte reads in flight, so fewer, longer groups still fill the GPU, and the second
// launch, a few blocks reading every partial row, is short. The groups depend on the shape and
// the alignment alone (so does the order of the sums).
constexpr int64_t kMinPackedRowsPerGroup = 256;

template <typename T, typename Out>
void reduce_columns(Out* dst, const Tensor& in, int64_t cols, int64_t rows, int64_t row_stride, ReduceKind kind,
                    const cuda::Stream& stream) {
  using A = acc_t<T>;
  const T* src = static_cast<const T*>(in.data_ptr());
  const bool packed = packed_columns(src, cols, row_stride);
  const int64_t cols_per_block = kColTile * (packed ? cuda::pack_size<T>() : 1);
  const int64_t col_blocks = (cols + cols_per_block - 1) / cols_per_block;
  const int64_t wanted = std::max<int64_t>(1, kTargetBlocks / col_blocks);
  const int64_t min_rows = packed ? kMinPackedRowsPerGroup : kMinRowsPerGroup;
  const int64_t groups = std::clamp<int64_t>(std::min(wanted, rows / min_rows), 1, 65535);
  if (groups == 1) {
    launch_reduce_columns<T, Out, A>(dst, src, cols, rows, row_stride, 1, kind, stream);
    return;
  }
  const Tensor partial = empty({groups, cols}, TensorOptions().dtype(dtype_of<A>()).device(in.device()));
  A* part = static_cast<A*>(partial.data_ptr());
  launch_reduce_columns<T, A, A>(part, src, cols, rows, row_stride, groups, kind, stream);
  launch_reduce_columns<A, Out, A>(dst, part, cols, groups, cols, 1, kind, stream);
}

// The rows kernel's case: a contiguous input and output, few outputs, long rows. Rows of 4096
// elements or more split into blocks of kRowSplit elements; one block per output would leave a
// long row (a loss's mean over the batch) to 256 threads alone, computing an index per element,
// a large share of a small model's step. The splits depend on the shape alone, so the sum's
// order does too.
constexpr int64_t kRowSplit = 4096;
constexpr int64_t kMaxRowsOuter = 1024;

template <typename T>
bool reduce_rows(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner, ReduceKind kind,
                 const cuda::Stream& stream) {
  using A = acc_t<T>;
  if (!in.is_contiguous() || !out.is_contiguous() || inner < 2 * kRowSplit || outer > kMaxRowsOuter) return false;
  const int64_t splits = std::min<int64_t>((inner + kRowSplit - 1) / kRowSplit, 65535);
  const int64_t per_split = (inner + splits - 1) / splits;
  const Tensor partial = empty({outer, splits}, TensorOptions().dtype(dtype_of<A>()).device(out.device()));
  reduce_rows_kernel<T, A, A>
      <<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(outer)), kReduceThreads, 0, stream.handle()>>>(
          static_cast<A*>(partial.data_ptr()), static_cast<const T*>(in.data_ptr()), inner, per_split, kind);
  MT_CUDA_CHECK_LAUNCH();
  reduce_rows_kernel<A, T, A><<<dim3(1, static_cast<unsigned>(outer)), kReduceThreads, 0, stream.handle()>>>(
      static_cast<T*>(out.data_ptr()), static_cast<const A*>(partial.data_ptr()), splits, splits, kind);
  MT_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

void reduce_cuda(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner, ReduceKind kind) {
  if (outer == 0) return;
  const cuda::Stream stream = cuda::current_stream(out.device().index);
  const int64_t row_stride = column_row_stride(in, outer, inner);
  if (row_stride >= 0 && out.is_contiguous()) {
    dispatch_floating(in.dtype(), kind == ReduceKind::sum ? "sum" : "max", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (out.dtype() == in.dtype())
        return reduce_columns<T>(static_cast<T*>(out.data_ptr()), in, outer, inner, row_stride, kind, stream);
      MT_INTERNAL_ASSERT(out.dtype() == dtype_of<acc_t<T>>(), "reduce: ", dtype_name(in.dtype()), " into ",
                         dtype_name(out.dtype()));
      reduce_columns<T>(static_cast<acc_t<T>*>(out.data_ptr()), in, outer, inner, row_stride, kind, stream);
    });
    return;
  }
  MT_INTERNAL_ASSERT(out.dtype() == in.dtype(), "reduce: ", dtype_name(in.dtype()), " into ", dtype_name(out.dtype()),
                     " takes the column layout");
  bool done = false;
  dispatch_floating(in.dtype(), kind == ReduceKind::sum ? "sum" : "max", [&](auto tag) {
    done = reduce_rows<typename decltype(tag)::type>(out, in, outer, inner, kind, stream);
  });
  if (done) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(outer, 65535));
  dispatch_floating(in.dtype(), kind == ReduceKind::sum ? "sum" : "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_kernel<T><<<blocks, kReduceThreads, 0, stream.handle()>>>(
        static_cast<T*>(out.data_ptr()), StridedIndexer(out), static_cast<const T*>(in.data_ptr()), StridedIndexer(in),
        outer, inner, kind);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::ops

using mt::Tensor;
MT_INSTANTIATE_MAP_BINARY(mt::ops::EqualMask);
