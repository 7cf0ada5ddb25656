// CPU embedding kernels: a row copy per id forward, a row add per id backward.
#include <algorithm>

#include "core/dispatch.h"
#include "ops/embedding/embedding_kernels.h"

namespace mt::ops {

void embedding_forward_cpu(const Tensor& out, const Tensor& weight, const Tensor& ids) {
  const int64_t N = out.size(0), C = out.size(1), V = weight.size(0);
  dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
    using I = typename decltype(id_tag)::type;
    const I* id = static_cast<const I*>(ids.data_ptr());
    for (int64_t n = 0; n < N; ++n) {
      const auto v = static_cast<int64_t>(id[n]);
      MT_CHECK(v >= 0 && v < V, "embedding: id ", v, " (at flat position ", n,
               " of ids) is out of range for a table of V = ", V, " rows; ids must lie in [0, ", V, ")");
    }
    dispatch_floating(out.dtype(), "embedding", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* w = static_cast<const T*>(weight.data_ptr());
      T* o = static_cast<T*>(out.data_ptr());
      for (int64_t n = 0; n < N; ++n) {
        const T* row = w + static_cast<int64_t>(id[n]) * C;
        std::copy(row, row + C, o + n * C);
      }
    });
  });
}

void embedding_backward_cpu(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& ids) {
  const int64_t N = grad_out.size(0), C = grad_out.size(1), V = grad_weight.size(0);
  dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
    using I = typename decltype(id_tag)::type;
    const I* id = static_cast<const I*>(ids.data_ptr());
    dispatch_floating(grad_out.dtype(), "embedding", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      MT_INTERNAL_ASSERT(grad_weight.dtype() == dtype_of<A>(), "embedding: accumulation buffer has the wrong dtype");
      A* gw = static_cast<A*>(grad_weight.data_ptr());
      const T* g = static_cast<const T*>(grad_out.data_ptr());
      for (int64_t n = 0; n < N; ++n) {
        const auto v = static_cast<int64_t>(id[n]);
        if (v < 0 || v >= V) continue;  // rejected by the forward; kept in bounds regardless
        A* row = gw + v * C;
        const T* src = g + n * C;
        for (int64_t c = 0; c < C; ++c) row[c] += convert<A>(src[c]);
      }
    });
  });
}

}  // namespace mt::ops
