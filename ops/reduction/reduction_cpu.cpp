// CPU reductions: out[o] = the reduction of in[o, 0..inner) (in's kept dims first, its
// reduced dims last). Each output combines its elements in index order, one after another,
// whatever the layout and however many threads share the outputs: the results are bit for
// bit those of a plain loop over the elements.
//
// Two walks. Outputs whose elements lie side by side in memory (a sum over leading dims,
// such as a bias gradient over rows) go row by row, each row adding into a block of running
// outputs, so that the inner loop reads contiguous elements and vectorises. Any other layout
// walks each output's elements with the joint strided walk (core/cpu_loops.h): offsets by
// division once per output, then by adding strides: a division per element would cost far more
// than the addition it serves.
#include <algorithm>
#include <vector>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/reduction/reducers.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt::ops {

namespace {

// The stride of dims [begin, end) of a view when they collapse into one row-major dim (dims of
// size 1 skipped; 1 when every dim is); false when they do not.
bool collapsed_stride(const Shape& shape, const Shape& strides, size_t begin, size_t end, int64_t* stride) {
  int64_t inner_stride = 1, span = 1;  // the dim collapsed so far, from the innermost out
  bool any = false;
  for (size_t d = end; d-- > begin;) {
    if (shape[d] == 1) continue;
    if (!any) {
      inner_stride = strides[d];
      span = shape[d];
      any = true;
    } else if (strides[d] == inner_stride * span) {
      span *= shape[d];
    } else {
      return false;
    }
  }
  *stride = inner_stride;
  return true;
}

// The number of leading dims of `shape` that hold the `outer` kept elements.
size_t kept_dims(const Shape& shape, int64_t outer) {
  size_t k = 0;
  for (int64_t product = 1; k < shape.size() && product != outer; ++k) product *= shape[k];
  return k;
}

template <ReduceKind kKind, typename T>
void reduce_typed(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* y = static_cast<T*>(out.data_ptr());           // contiguous: reduce() makes it
  const int64_t grain = cpu::rows_per_task(inner);  // outputs per task
  const size_t kept = kept_dims(in.shape(), outer);
  int64_t out_step = 0, row_step = 0;
  if (collapsed_stride(in.shape(), in.strides(), 0, kept, &out_step) &&
      collapsed_stride(in.shape(), in.strides(), kept, in.shape().size(), &row_step) && out_step == 1 && outer > 1) {
    cpu::parallel_for(outer, grain, [&](int64_t begin, int64_t end) {
      std::vector<A> acc(static_cast<size_t>(end - begin), reduce_identity<A>(kKind));
      for (int64_t i = 0; i < inner; ++i) {
        const T* row = x + i * row_step + begin;
        for (int64_t o = 0; o < end - begin; ++o) acc[o] = reduce_combine(kKind, acc[o], convert<A>(row[o]));
      }
      for (int64_t o = begin; o < end; ++o) y[o] = convert<T>(acc[o - begin]);
    });
    return;
  }
  const cpu::StridedWalk<1> walk(in.shape(), {&in.strides()});
  cpu::parallel_for(outer, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      A acc = reduce_identity<A>(kKind);
      walk.run(o * inner, (o + 1) * inner,
               [&](const auto& off) { acc = reduce_combine(kKind, acc, convert<A>(x[off[0]])); });
      y[o] = convert<T>(acc);
    }
  });
}

}  // namespace

void reduce_cpu(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner, ReduceKind kind) {
  MT_INTERNAL_ASSERT(out.is_contiguous() && out.numel() == outer, "reduce_cpu: out ", shape_str(out.shape()), " for ",
                     outer, " outputs");
  if (outer == 0) return;
  dispatch_floating(in.dtype(), kind == ReduceKind::sum ? "sum" : "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (inner == 0) {  // an empty sum (reduce() refuses an empty max)
      T* y = static_cast<T*>(out.data_ptr());
      std::fill(y, y + outer, convert<T>(reduce_identity<acc_t<T>>(kind)));
    } else if (kind == ReduceKind::sum) {
      reduce_typed<ReduceKind::sum, T>(out, in, outer, inner);
    } else {
      reduce_typed<ReduceKind::max, T>(out, in, outer, inner);
    }
  });
}

}  // namespace mt::ops
