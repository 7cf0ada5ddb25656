// CPU cross-entropy kernels over contiguous rows [rows, C]; math in acc_t. Rows are split
// across the cores; each row's arithmetic is the same on any thread, and the reduction over
// rows stays one loop in row order.
#include <limits>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/loss/loss_kernels.h"
#include "ops/math.h"
#include "ops/softmax/row_reduce.h"

namespace mt::ops {

namespace {
constexpr const char* kOp = "cross_entropy";
}  // namespace

void cross_entropy_forward_cpu(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                               int64_t ignore_index) {
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  dispatch_floating(logits.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dispatch_index(target.dtype(), kOp, [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      const T* x = static_cast<const T*>(logits.data_ptr());
      const I* t = static_cast<const I*>(target.data_ptr());
      A* l = static_cast<A*>(loss.data_ptr());
      A* s_out = static_cast<A*>(lse.data_ptr());
      cpu::parallel_for(rows, cpu::rows_per_task(classes), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = x + r * classes;
          A m = rowwise::Max::identity<A>();
          for (int64_t c = 0; c < classes; ++c) m = rowwise::Max{}(m, convert<A>(xr[c]));
          A s = 0;
          for (int64_t c = 0; c < classes; ++c) s += math::exp(convert<A>(xr[c]) - m);
          const A log_s = math::log(s);
          s_out[r] = m + log_s;
          const auto k = static_cast<int64_t>(t[r]);
          if (k == ignore_index) {
            l[r] = A(0);
          } else if (k < 0 || k >= classes) {
            l[r] = std::numeric_limits<A>::quiet_NaN();
          } else {
            l[r] = log_s - (convert<A>(xr[k]) - m);
          }
        }
      });
    });
  });
}

void cross_entropy_reduce_cpu(const Tensor& out, const Tensor& count, const Tensor& loss, const Tensor& target,
                              int64_t ignore_index, Reduction reduction) {
  const int64_t rows = loss.numel();
  dispatch_loss_dtype(loss.dtype(), [&](auto tag) {
    using A = typename decltype(tag)::type;
    dispatch_index(target.dtype(), kOp, [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      const A* l = static_cast<const A*>(loss.data_ptr());
      const I* t = static_cast<const I*>(target.data_ptr());
      A total = 0;
      int64_t n = 0;
      for (int64_t r = 0; r < rows; ++r) {
        total += l[r];
        n += static_cast<int64_t>(t[r]) != ignore_index ? 1 : 0;
      }
      *static_cast<int64_t*>(count.data_ptr()) = n;
      // mean over zero rows is 0/0 = NaN, as in PyTorch.
      *static_cast<A*>(out.data_ptr()) = reduction == Reduction::mean ? total / static_cast<A>(n) : total;
    });
  });
}

void cross_entropy_backward_cpu(const Tensor& dlogits, const Tensor& grad, const Tensor& logits, const Tensor& target,
                                const Tensor& lse, const Tensor& count, int64_t ignore_index, Reduction reduction) {
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  dispatch_floating(logits.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dispatch_index(target.dtype(), kOp, [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      const T* x = static_cast<const T*>(logits.data_ptr());
      const I* t = static_cast<const I*>(target.data_ptr());
      const A* s = static_cast<const A*>(lse.data_ptr());
      const A* g = static_cast<const A*>(grad.data_ptr());
      T* dx = static_cast<T*>(dlogits.data_ptr());
      const int64_t g_stride = reduction == Reduction::none ? 1 : 0;
      const A scale =
          reduction == Reduction::mean ? A(1) / static_cast<A>(*static_cast<const int64_t*>(count.data_ptr())) : A(1);
      cpu::parallel_for(rows, cpu::rows_per_task(classes), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = x + r * classes;
          T* dr = dx + r * classes;
          const auto k = static_cast<int64_t>(t[r]);
          const A gr = g[r * g_stride] * scale;
          for (int64_t c = 0; c < classes; ++c) {
            A v;
            if (k == ignore_index) {
              v = A(0);
            } else if (k < 0 || k >= classes) {
              v = std::numeric_limits<A>::quiet_NaN();
            } else {
              v = (math::exp(convert<A>(xr[c]) - s[r]) - (c == k ? A(1) : A(0))) * gr;
            }
            dr[c] = convert<T>(v);
          }
        }
      });
    });
  });
}

void cross_entropy_unit_grad_inplace_cpu(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                                         const Tensor& target, int64_t ignore_index) {
  cross_entropy_forward_cpu(loss, lse, logits, target, ignore_index);
  const Tensor unit = full({}, 1.0, TensorOptions().dtype(lse.dtype()));
  // Element-wise in place: each gradient element reads only its own logit.
  cross_entropy_backward_cpu(logits, unit, logits, target, lse, Tensor(), ignore_index, Reduction::sum);
}

void scale_by_loss_grad_cpu(const Tensor& out, const Tensor& in, const Tensor& grad, const Tensor& count,
                            Reduction reduction) {
  dispatch_floating(out.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    A g = *static_cast<const A*>(grad.data_ptr());
    if (reduction == Reduction::mean) {
      // A mean over no rows: the loss is NaN, but every gradient is 0 (the rows are all ignored).
      const int64_t rows = *static_cast<const int64_t*>(count.data_ptr());
      g = rows == 0 ? A(0) : g / static_cast<A>(rows);
    }
    T* o = static_cast<T*>(out.data_ptr());
    const int64_t n = out.numel();
    auto scale = [&](const auto* x) {
      cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) o[i] = convert<T>(convert<A>(x[i]) * g);
      });
    };
    if (in.dtype() == out.dtype()) {
      scale(static_cast<const T*>(in.data_ptr()));
    } else {
      scale(static_cast<const A*>(in.data_ptr()));
    }
  });
}

}  // namespace mt::ops
