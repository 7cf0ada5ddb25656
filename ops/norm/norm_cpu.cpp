// CPU layer / RMS norm kernels over contiguous rows [rows, C]; statistics and
// arithmetic in acc_t, the parameter gradients summed over rows in acc_t too.
#include <vector>

#include "core/dispatch.h"
#include "ops/math.h"
#include "ops/norm/norm_kernels.h"

namespace mt::ops {

void norm_forward_cpu(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  dispatch_floating(x.dtype(), name_of(kind), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* in = static_cast<const T*>(x.data_ptr());
    const T* w = data_or_null<T>(weight);
    const T* b = data_or_null<T>(bias);
    T* out = static_cast<T*>(y.data_ptr());
    A* mean_out = mutable_data_or_null<A>(mean);
    A* rstd_out = static_cast<A*>(rstd.data_ptr());
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = in + r * cols;
      T* yr = out + r * cols;
      A mu = 0;
      if (kind == NormKind::layer) {
        for (int64_t c = 0; c < cols; ++c) mu += convert<A>(xr[c]);
        mu /= static_cast<A>(cols);
      }
      A var = 0;  // two passes: the centred sum of squares does not cancel
      for (int64_t c = 0; c < cols; ++c) {
        const A d = convert<A>(xr[c]) - mu;
        var += d * d;
      }
      var /= static_cast<A>(cols);
      const A rs = A(1) / math::sqrt(var + static_cast<A>(eps));
      if (mean_out != nullptr) mean_out[r] = mu;
      rstd_out[r] = rs;
      for (int64_t c = 0; c < cols; ++c) {
        A v = (convert<A>(xr[c]) - mu) * rs;
        if (w != nullptr) v *= convert<A>(w[c]);
        if (b != nullptr) v += convert<A>(b[c]);
        yr[c] = convert<T>(v);
      }
    }
  });
}

void norm_backward_cpu(NormKind kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                       const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight) {
  const int64_t rows = dy.shape()[0], cols = dy.shape()[1];
  dispatch_floating(dy.dtype(), name_of(kind), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* g = static_cast<const T*>(dy.data_ptr());
    const T* in = data_or_null<T>(x);
    const T* w = data_or_null<T>(weight);
    const A* mean_in = data_or_null<A>(mean);
    const A* rstd_in = data_or_null<A>(rstd);
    T* dx_out = mutable_data_or_null<T>(dx);
    std::vector<A> dw(dweight.defined() ? static_cast<size_t>(cols) : 0, A(0));
    std::vector<A> db(dbias.defined() ? static_cast<size_t>(cols) : 0, A(0));
    const A inv_cols = A(1) / static_cast<A>(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const T* gr = g + r * cols;
      if (!db.empty()) {
        for (int64_t c = 0; c < cols; ++c) db[static_cast<size_t>(c)] += convert<A>(gr[c]);
      }
      if (dx_out == nullptr && dw.empty()) continue;
      const T* xr = in + r * cols;
      const A mu = mean_in != nullptr ? mean_in[r] : A(0);
      const A rs = rstd_in[r];
      if (!dw.empty()) {
        for (int64_t c = 0; c < cols; ++c) {
          dw[static_cast<size_t>(c)] += convert<A>(gr[c]) * ((convert<A>(xr[c]) - mu) * rs);
        }
      }
      if (dx_out != nullptr) {
        A sum_g = 0, sum_gx = 0;  // sums over the row of g and g * xhat, g = dy * weight
        for (int64_t c = 0; c < cols; ++c) {
          const A gc = w != nullptr ? convert<A>(gr[c]) * convert<A>(w[c]) : convert<A>(gr[c]);
          sum_g += gc;
          sum_gx += gc * ((convert<A>(xr[c]) - mu) * rs);
        }
        const A mean_g = kind == NormKind::layer ? sum_g * inv_cols : A(0);
        const A mean_gx = sum_gx * inv_cols;
        T* dr = dx_out + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const A gc = w != nullptr ? convert<A>(gr[c]) * convert<A>(w[c]) : convert<A>(gr[c]);
          const A xhat = (convert<A>(xr[c]) - mu) * rs;
          dr[c] = convert<T>(rs * (gc - mean_g - xhat * mean_gx));
        }
      }
    }
    T* dw_out = mutable_data_or_null<T>(dweight);
    T* db_out = mutable_data_or_null<T>(dbias);
    for (int64_t c = 0; c < cols; ++c) {
      if (dw_out != nullptr) dw_out[c] = convert<T>(dw[static_cast<size_t>(c)]);
      if (db_out != nullptr) db_out[c] = convert<T>(db[static_cast<size_t>(c)]);
    }
  });
}

}  // namespace mt::ops
