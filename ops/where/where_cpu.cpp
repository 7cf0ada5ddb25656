// CPU select loop. bool and u8 conditions are both one byte; reading either
// through unsigned char is well defined.
#include "core/dispatch.h"
#include "core/strided.h"
#include "ops/where/where_kernels.h"

namespace mt::ops {

void where_cpu(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  const StridedIndexer oi(out), ci(cond), ai(a), bi(b);
  const auto* c = static_cast<const unsigned char*>(cond.data_ptr());
  dispatch_floating(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    for (int64_t i = 0; i < n; ++i) o[oi.offset(i)] = c[ci.offset(i)] != 0 ? x[ai.offset(i)] : y[bi.offset(i)];
  });
}

}  // namespace mt::ops
