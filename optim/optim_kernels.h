// Internal: the element loops of the optimizers and the loss scaler, one per
// device. Scalars that change every step on the device (the loss scale, the
// found-inf flag) are read through device pointers, so no host sync is needed.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt::optim_kernels {

struct AdamWArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled = true;  // AdamW (decay the weights) vs Adam (add decay to the gradient)
  // CUDA: when set, the kernel reads the rate here when it runs instead of taking `lr`, so
  // that a step replayed from a CUDA Graph uses the rate of the moment (the schedule's).
  const double* lr_on_device = nullptr;
};

// grad *= 1 / scale; found_inf (f32 [1]) becomes 1 if any result is inf or NaN.
void unscale_cpu(const Tensor& grad, const Tensor& scale, const Tensor& found_inf);
// On CUDA one multi-tensor launch (per dtype) covers every gradient.
void unscale_cuda(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf);

// Sets every element of the tensors (contiguous, on one CUDA device) to 0: one multi-tensor launch
// per dtype where zero_() would take one memset each (Optimizer::zero_grad(set_to_none=false)).
void zero_cuda(const std::vector<Tensor>& tensors);

// step (i64 [1]) += 1 unless found_inf (f32 [1], may be undefined) is non-zero:
// the optimizer's step count lives beside its moments, on their device.
void advance_step_cpu(const Tensor& step, const Tensor& found_inf);

// One AdamW step on one parameter (f32/f16/bf16/f64) with f32 (f64 for f64) moments,
// bias-corrected with the count in `step`. With a master copy (f32, may be
// undefined) the update happens on the master and the parameter receives it
// rounded once. Skipped entirely when found_inf (may be undefined) is non-zero. With a copy
// (f16/bf16 beside an f32 parameter, may be undefined; CUDA only) the kernel also writes the
// parameter rounded to the copy's dtype, a skipped step included.
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq, step, master, copy;
};
void adamw_cpu(const AdamWTensors& t, const AdamWArgs& args, const Tensor& found_inf);
// On CUDA the whole list is updated by multi-tensor launches (one per dtype
// combination), each step count advanced on the device first.
void adamw_cuda(const std::vector<AdamWTensors>& list, const AdamWArgs& args, const Tensor& found_inf);

// The scaler's update rule on its device state (scale f32 [1], growth_tracker i32 [1],
// consecutive_skips i32 [1]): on inf, scale *= backoff and the tracker resets;
// otherwise after `interval` clean steps in a row scale *= growth.
struct ScalerUpdateArgs {
  double growth = 2.0, backoff = 0.5;
  int64_t interval = 2000;
};
void scaler_update_cpu(const Tensor& scale, const Tensor& growth_tracker, const Tensor& consecutive_skips,
                       const Tensor& found_inf, const ScalerUpdateArgs& args);
void scaler_update_cuda(const Tensor& scale, const Tensor& growth_tracker, const Tensor& consecutive_skips,
                        const Tensor& found_inf, const ScalerUpdateArgs& args);

}  // namespace mt::optim_kernels
