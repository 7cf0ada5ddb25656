// CPU softmax kernels over contiguous rows [rows, cols]; math in acc_t. Rows are split
// across the cores; each row's arithmetic is the same on any thread.
#include <vector>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/math.h"
#include "ops/softmax/row_reduce.h"
#include "ops/softmax/softmax_kernels.h"

namespace mt::ops {

void softmax_forward_cpu(const Tensor& out, const Tensor& x, int64_t rows, int64_t cols, SoftmaxKind kind) {
  dispatch_floating(x.dtype(), name_of(kind), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* in = static_cast<const T*>(x.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    cpu::parallel_for(rows, cpu::rows_per_task(cols), [&](int64_t begin, int64_t end) {
      std::vector<A> e(static_cast<size_t>(cols));  // the row's exponentials, each computed once
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = in + r * cols;
        T* yr = y + r * cols;
        A m = rowwise::Max::identity<A>();
        for (int64_t c = 0; c < cols; ++c) m = rowwise::Max{}(m, convert<A>(xr[c]));
        A s = 0;
        for (int64_t c = 0; c < cols; ++c) {
          e[c] = math::exp(convert<A>(xr[c]) - m);
          s += e[c];
        }
        if (kind == SoftmaxKind::softmax) {
          const A inv = A(1) / s;
          for (int64_t c = 0; c < cols; ++c) yr[c] = convert<T>(e[c] * inv);
        } else {
          const A log_s = math::log(s);
          for (int64_t c = 0; c < cols; ++c) yr[c] = convert<T>((convert<A>(xr[c]) - m) - log_s);
        }
      }
    });
  });
}

void softmax_backward_cpu(const Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols,
                          SoftmaxKind kind) {
  dispatch_floating(y.dtype(), name_of(kind), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* g = static_cast<const T*>(dy.data_ptr());
    const T* out = static_cast<const T*>(y.data_ptr());
    T* grad = static_cast<T*>(dx.data_ptr());
    cpu::parallel_for(rows, cpu::rows_per_task(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* gr = g + r * cols;
        const T* yr = out + r * cols;
        T* dr = grad + r * cols;
        A s = 0;
        if (kind == SoftmaxKind::softmax) {
          for (int64_t c = 0; c < cols; ++c) s += convert<A>(gr[c]) * convert<A>(yr[c]);
          for (int64_t c = 0; c < cols; ++c) dr[c] = convert<T>(convert<A>(yr[c]) * (convert<A>(gr[c]) - s));
        } else {
          for (int64_t c = 0; c < cols; ++c) s += convert<A>(gr[c]);
          for (int64_t c = 0; c < cols; ++c) dr[c] = convert<T>(convert<A>(gr[c]) - math::exp(convert<A>(yr[c])) * s);
        }
      }
    });
  });
}

}  // namespace mt::ops
