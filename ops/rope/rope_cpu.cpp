// CPU RoPE loop: a task per run of (b, h, t) rows, the angle's cosine and sine computed once per
// (row, i) and applied to the pair (i, i + D/2).
#include <cmath>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/rope/rope_kernels.h"

namespace mt::ops {

void rope_cpu(const Tensor& out, const Tensor& in, const Tensor& inv_freq, const RopeRotation& rotation) {
  const int64_t B = in.size(0), H = in.size(1), T = in.size(2), half = in.size(3) / 2;
  const float* freq = static_cast<const float*>(inv_freq.data_ptr());
  dispatch_floating(in.dtype(), "rope", [&](auto tag) {
    using Tv = typename decltype(tag)::type;
    using A = acc_t<Tv>;
    const Tv* x = static_cast<const Tv*>(in.data_ptr());
    Tv* y = static_cast<Tv*>(out.data_ptr());
    cpu::parallel_for(B * H * T, cpu::rows_per_task(2 * half), [&](int64_t first, int64_t end) {
      for (int64_t row = first; row < end; ++row) {
        const int64_t t = row % T, h = (row / T) % H, b = row / (T * H);
        const Tv* xr = x + b * in.stride(0) + h * in.stride(1) + t * in.stride(2);
        Tv* yr = y + b * out.stride(0) + h * out.stride(1) + t * out.stride(2);
        const int64_t position = rotation.positions ? rotation.positions[b * T + t] : rotation.start + t;
        for (int64_t i = 0; i < half; ++i) {
          const float angle = static_cast<float>(position) * freq[i];
          const A c = std::cos(static_cast<A>(angle)),
                  s = static_cast<A>(rotation.sign) * std::sin(static_cast<A>(angle));
          const A x1 = convert<A>(xr[i]), x2 = convert<A>(xr[i + half]);
          yr[i] = convert<Tv>(x1 * c - x2 * s);
          yr[i + half] = convert<Tv>(x2 * c + x1 * s);
        }
      }
    });
  });
}

}  // namespace mt::ops
