#include <cmath>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"

namespace mt::optim_kernels {

void unscale_cpu(const Tensor& grad, const Tensor& scale, const Tensor& found_inf) {
  const float inv_scale = 1.0f / *scale.data<float>();
  float* flag = found_inf.data<float>();
  dispatch_floating(grad.dtype(), "unscale_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* g = static_cast<T*>(grad.data_ptr());
    for (int64_t i = 0; i < grad.numel(); ++i) {
      const A v = convert<A>(g[i]) * static_cast<A>(inv_scale);
      if (!std::isfinite(v)) *flag = 1.0f;
      g[i] = convert<T>(v);
    }
  });
}

void advance_step_cpu(const Tensor& step, const Tensor& found_inf) {
  if (found_inf.defined() && *found_inf.data<float>() != 0.0f) return;
  ++*step.data<int64_t>();
}

void adamw_cpu(const AdamWTensors& t, const AdamWArgs& args, const Tensor& found_inf) {
  if (found_inf.defined() && *found_inf.data<float>() != 0.0f) return;
  const AdamWCoefficients c = AdamWCoefficients::from(args, *t.step.data<int64_t>());
  dispatch_floating(t.param.dtype(), "adamw", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* p = static_cast<T*>(t.param.data_ptr());
    const T* g = static_cast<const T*>(t.grad.data_ptr());
    A* m = static_cast<A*>(t.exp_avg.data_ptr());
    A* v = static_cast<A*>(t.exp_avg_sq.data_ptr());
    A* master = t.master.defined() ? static_cast<A*>(t.master.data_ptr()) : nullptr;
    // Each element's update is its own: split across the cores, the values are the same.
    cpu::for_each_dense(t.param.numel(), [&](int64_t i) {
      A pv = master ? master[i] : convert<A>(p[i]);
      adamw_update<A>(pv, convert<A>(g[i]), m[i], v[i], c);
      if (master) master[i] = pv;
      p[i] = convert<T>(pv);
    });
  });
}

void scaler_update_cpu(const Tensor& scale, const Tensor& growth_tracker, const Tensor& consecutive_skips,
                       const Tensor& found_inf, const ScalerUpdateArgs& args) {
  float& s = *scale.data<float>();
  int32_t& tracker = *growth_tracker.data<int32_t>();
  int32_t& skips = *consecutive_skips.data<int32_t>();
  if (*found_inf.data<float>() != 0.0f) {
    s = static_cast<float>(s * args.backoff);
    tracker = 0;
    ++skips;
    return;
  }
  skips = 0;
  if (++tracker >= args.interval) {
    s = static_cast<float>(s * args.growth);
    tracker = 0;
  }
}

}  // namespace mt::optim_kernels
