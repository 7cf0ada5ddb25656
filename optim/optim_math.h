// The per-element update formulas shared by the CPU and CUDA optimizer loops.
#pragma once

#include <cmath>

#include "core/macros.h"
#include "ops/math.h"
#include "optim/optim_kernels.h"

namespace mt::optim_kernels {

// The step's scalars: bias corrections fold into a step size and a divisor.
// Computed where the step count lives (on the device for CUDA parameters).
struct AdamWCoefficients {
  double lr, beta1, beta2, eps, weight_decay, step_size, bias_correction2_sqrt;
  bool decoupled;
  MT_HOST_DEVICE static AdamWCoefficients from(const AdamWArgs& a, int64_t step) {
    const double bc1 = 1.0 - ::pow(a.beta1, static_cast<double>(step));
    const double bc2 = 1.0 - ::pow(a.beta2, static_cast<double>(step));
    return {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.lr / bc1, ::sqrt(bc2), a.decoupled};
  }
};

// One element: p, m, v updated in place (A is float or double).
template <typename A>
MT_HOST_DEVICE inline void adamw_update(A& p, A g, A& m, A& v, const AdamWCoefficients& c) {
  if (c.decoupled) {
    p -= static_cast<A>(c.lr * c.weight_decay) * p;
  } else {
    g += static_cast<A>(c.weight_decay) * p;
  }
  m = static_cast<A>(c.beta1) * m + static_cast<A>(1.0 - c.beta1) * g;
  v = static_cast<A>(c.beta2) * v + static_cast<A>(1.0 - c.beta2) * g * g;
  const A denom = math::sqrt(v) / static_cast<A>(c.bias_correction2_sqrt) + static_cast<A>(c.eps);
  p -= static_cast<A>(c.step_size) * m / denom;
}

}  // namespace mt::optim_kernels
