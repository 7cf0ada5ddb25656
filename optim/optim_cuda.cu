// CUDA loops of the optimizers and the loss scaler. The loss scale and the
// found-inf flag stay in device memory: no host sync per step (DESIGN 4).
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"

namespace mt::optim_kernels {

namespace {

// ---- kernels ----

template <typename T>
__global__ void unscale_kernel(T* grad, int64_t n, const float* scale, float* found_inf) {
  using A = acc_t<T>;
  const A inv_scale = static_cast<A>(1.0f / *scale);
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const A v = convert<A>(grad[i]) * inv_scale;
    bad |= !isfinite(v);
    grad[i] = convert<T>(v);
  }
  if (bad) *found_inf = 1.0f;  // a benign race: every writer stores the same value
}

__global__ void advance_step_kernel(int64_t* step, const float* found_inf) {
  if (found_inf == nullptr || *found_inf == 0.0f) *step += 1;
}

template <typename T, typename A>
__global__ void adamw_kernel(T* param, const T* grad, A* m, A* v, A* master, int64_t n, AdamWArgs args,
                             const int64_t* step, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const AdamWCoefficients c = AdamWCoefficients::from(args, *step);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A p = master != nullptr ? master[i] : convert<A>(param[i]);
    adamw_update<A>(p, convert<A>(grad[i]), m[i], v[i], c);
    if (master != nullptr) master[i] = p;
    param[i] = convert<T>(p);
  }
}

__global__ void scaler_update_kernel(float* scale, int32_t* tracker, int32_t* skips, const float* found_inf,
                                     ScalerUpdateArgs args) {
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(*scale * args.backoff);
    *tracker = 0;
    *skips += 1;
    return;
  }
  *skips = 0;
  if (++*tracker >= args.interval) {
    *scale = static_cast<float>(*scale * args.growth);
    *tracker = 0;
  }
}

}  // namespace

// ---- entry points ----

void unscale_cuda(const Tensor& grad, const Tensor& scale, const Tensor& found_inf) {
  const int64_t n = grad.numel();
  if (n == 0) return;
  const cuda::Stream stream = cuda::current_stream(grad.device().index);
  dispatch_floating(grad.dtype(), "unscale_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    unscale_kernel<T><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(grad.data_ptr()), n, scale.data<float>(), found_inf.data<float>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

void advance_step_cuda(const Tensor& step, const Tensor& found_inf) {
  const cuda::Stream stream = cuda::current_stream(step.device().index);
  advance_step_kernel<<<1, 1, 0, stream.handle()>>>(step.data<int64_t>(),
                                                    found_inf.defined() ? found_inf.data<float>() : nullptr);
  MT_CUDA_CHECK_LAUNCH();
}

void adamw_cuda(const AdamWTensors& t, const AdamWArgs& args, const Tensor& found_inf) {
  const int64_t n = t.param.numel();
  if (n == 0) return;
  const cuda::Stream stream = cuda::current_stream(t.param.device().index);
  dispatch_floating(t.param.dtype(), "adamw", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    adamw_kernel<T, A><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(
        static_cast<T*>(t.param.data_ptr()), static_cast<const T*>(t.grad.data_ptr()),
        static_cast<A*>(t.exp_avg.data_ptr()), static_cast<A*>(t.exp_avg_sq.data_ptr()),
        t.master.defined() ? static_cast<A*>(t.master.data_ptr()) : nullptr, n, args, t.step.data<int64_t>(),
        found_inf.defined() ? found_inf.data<float>() : nullptr);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void scaler_update_cuda(const Tensor& scale, const Tensor& growth_tracker, const Tensor& consecutive_skips,
                        const Tensor& found_inf, const ScalerUpdateArgs& args) {
  const cuda::Stream stream = cuda::current_stream(scale.device().index);
  scaler_update_kernel<<<1, 1, 0, stream.handle()>>>(scale.data<float>(), growth_tracker.data<int32_t>(),
                                                     consecutive_skips.data<int32_t>(), found_inf.data<float>(), args);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::optim_kernels
