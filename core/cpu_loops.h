// CPU element loops: a joint row-major walk over same-shaped strided operands, and
// a parallel-for that splits large loops across the cores (OpenMP).
//
// The walk coalesces dimensions that are contiguous in every operand, computes each
// operand's offset once per chunk with divisions, then only adds strides: the inner
// loop is a plain strided loop the compiler can vectorise for contiguous operands.
// Element order within a chunk is row-major, and chunks cover [0, n) exactly once, so
// results do not depend on the thread count (no loop here reduces across elements).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/strided.h"
#include "core/tensor.h"

namespace mt::cpu {

// Elements per task below which a loop stays on one thread: the cost of waking
// threads (a few microseconds) must be small against the work.
constexpr int64_t kParallelGrain = 32768;

// Rows of `cols` elements per task for parallel_for over rows: at least kParallelGrain
// elements a task.
inline int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)); }

// Calls f(begin, end) over chunks covering [0, n), on several threads when n is large.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
#ifdef _OPENMP
  if (n > grain) {
    const int64_t chunks = (n + grain - 1) / grain;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) f(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
#endif
  (void)grain;
  f(0, n);
}

// Marks a loop whose iterations are independent so that the compiler vectorises it (OpenMP's
// simd directive; without OpenMP, nothing).
#ifdef _OPENMP
#define MT_SIMD_LOOP _Pragma("omp simd")
#else
#define MT_SIMD_LOOP
#endif

// Calls f(i) for every i in [0, n): chunks on several threads when n is large, each chunk one
// vectorisable loop. For operands that are dense and laid out alike (ops/loops.h), where element
// i of each sits at offset i; f must not carry anything from one i to the next.
template <typename F>
void for_each_dense(int64_t n, F&& f) {
  parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
    MT_SIMD_LOOP
    for (int64_t i = begin; i < end; ++i) f(i);
  });
}

template <size_t N>
class StridedWalk {
 public:
  // strides[k] are operand k's strides over `shape` (broadcast operands have stride 0).
  StridedWalk(const Shape& shape, const std::array<const Shape*, N>& strides) {
    MT_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "tensor has ", shape.size(), " dimensions; at most ",
             kMaxDims, " are supported");
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      bool mergeable = ndim_ > 0;
      for (size_t k = 0; k < N && mergeable; ++k) mergeable = stride_[k][ndim_ - 1] == (*strides[k])[d] * shape[d];
      if (mergeable) {
        size_[ndim_ - 1] *= shape[d];
        for (size_t k = 0; k < N; ++k) stride_[k][ndim_ - 1] = (*strides[k])[d];
      } else {
        size_[ndim_] = shape[d];
        for (size_t k = 0; k < N; ++k) stride_[k][ndim_] = (*strides[k])[d];
        ++ndim_;
      }
    }
    if (ndim_ == 0) {  // a single element
      size_[0] = 1;
      ndim_ = 1;
    }
  }

  // Calls body(offsets) for elements [begin, end) in row-major order; offsets[k] is
  // operand k's element offset.
  template <typename Body>
  void run(int64_t begin, int64_t end, Body&& body) const {
    int64_t index[kMaxDims];
    std::array<int64_t, N> offset{};
    int64_t rest = begin;
    for (int d = ndim_ - 1; d >= 0; --d) {
      index[d] = rest % size_[d];
      rest /= size_[d];
      for (size_t k = 0; k < N; ++k) offset[k] += index[d] * stride_[k][d];
    }
    const int inner = ndim_ - 1;
    for (int64_t i = begin; i < end;) {
      const int64_t count = std::min(size_[inner] - index[inner], end - i);
      std::array<int64_t, N> o = offset;
      for (int64_t j = 0; j < count; ++j) {
        body(o);
        for (size_t k = 0; k < N; ++k) o[k] += stride_[k][inner];
      }
      i += count;
      index[inner] += count;
      for (size_t k = 0; k < N; ++k) offset[k] += count * stride_[k][inner];
      for (int d = inner; d > 0 && index[d] == size_[d]; --d) {  // carry into the outer dims
        index[d] = 0;
        index[d - 1] += 1;
        for (size_t k = 0; k < N; ++k) offset[k] += stride_[k][d - 1] - size_[d] * stride_[k][d];
      }
    }
  }

 private:
  int ndim_ = 0;
  int64_t size_[kMaxDims] = {};
  int64_t stride_[N][kMaxDims] = {};
};

// Visits every element of same-shaped operands, in parallel for large tensors:
//   for_each_strided<2>(out.shape(), {&out.strides(), &in.strides()}, [&](const auto& o) { ... o[0], o[1] ... });
template <size_t N, typename Body>
void for_each_strided(const Shape& shape, const std::array<const Shape*, N>& strides, Body&& body) {
  const StridedWalk<N> walk(shape, strides);
  parallel_for(shape_numel(shape), kParallelGrain, [&](int64_t begin, int64_t end) { walk.run(begin, end, body); });
}

}  // namespace mt::cpu
