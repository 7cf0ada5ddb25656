#include <algorithm>
#include <cmath>

#include "core/dispatch.h"
#include "optim/clip_grad_kernels.h"

namespace mt::optim_kernels {

Tensor clip_grad_norm_cpu(const std::vector<Tensor>& grads, double max_norm, double eps, DType out_dtype,
                          const MultiTensorConfig& config) {
  const int64_t chunk = config.chunk_size;
  MT_INTERNAL_ASSERT(chunk > 0, "clip_grad_norm_cpu: chunk_size must be positive");
  // Chunk by chunk as the CUDA blocks do, so that both round alike.
  double sum_sq = 0.0;
  for (const Tensor& grad : grads) {
    dispatch_floating(grad.dtype(), "clip_grad_norm_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      const T* g = static_cast<const T*>(grad.data_ptr());
      const int64_t n = grad.numel();
      for (int64_t begin = 0; begin < n; begin += chunk) {
        const int64_t end = std::min(begin + chunk, n);
        double acc = 0;  // squares in acc_t, sums in f64 (as the CUDA kernel)
        for (int64_t i = begin; i < end; ++i) {
          const A v = convert<A>(g[i]);
          acc += static_cast<double>(v * v);
        }
        sum_sq += acc;
      }
    });
  }
  const Tensor total = full({}, std::sqrt(sum_sq), TensorOptions().dtype(out_dtype));
  const double coef = clip_coefficient(total.item(), max_norm, eps);
  for (const Tensor& grad : grads) {
    dispatch_floating(grad.dtype(), "clip_grad_norm_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      const A c = static_cast<A>(coef);
      if (c == A(1)) return;
      T* g = static_cast<T*>(grad.data_ptr());
      for (int64_t i = 0; i < grad.numel(); ++i) g[i] = convert<T>(convert<A>(g[i]) * c);
    });
  }
  return total;
}

}  // namespace mt::optim_kernels
