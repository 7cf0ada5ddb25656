#include "core/dispatch.h"
#include "core/strided.h"
#include "ops/reduction/reducers.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt::ops {

void reduce_cpu(const Tensor& out, const Tensor& in, int64_t outer, int64_t inner, ReduceKind kind) {
  const StridedIndexer ii(in), oi(out);
  dispatch_floating(in.dtype(), kind == ReduceKind::sum ? "sum" : "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    for (int64_t o = 0; o < outer; ++o) {
      A acc = reduce_identity<A>(kind);
      for (int64_t i = 0; i < inner; ++i) acc = reduce_combine(kind, acc, convert<A>(x[ii.offset(o * inner + i)]));
      y[oi.offset(o)] = convert<T>(acc);
    }
  });
}

}  // namespace mt::ops
