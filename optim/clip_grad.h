// Gradient clipping by the global L2 norm (torch.nn.utils.clip_grad_norm_):
//
//   scaler.unscale_(opt);                                   // unscale first, if scaling
//   mt::Tensor norm = mt::clip_grad_norm_(params, /*max_norm=*/1.0);
//   scaler.step(opt);
//
// total = sqrt(sum over every gradient g of sum(g^2)), each square computed in
// f32 (f64 for f64 gradients) and summed in f64. Every
// gradient is then multiplied in place by
//   coef = min(1, max_norm / (total + eps))
// computed on the gradients' device from the total (as returned): nothing is read
// back to the host, so a training step stays sync-free and capturable. On CUDA
// this is a few multi-tensor launches whatever the number of parameters
// (optim/multi_tensor.cuh); the result is deterministic.
//
// Non-finite gradients, as in PyTorch (which clamps with torch.clamp(max=1)):
// a NaN total gives coef = NaN and every gradient becomes NaN; an infinite total
// gives coef = 0, so finite gradients become 0 and infinite ones NaN. Either way
// the step is ruined: with a GradScaler, unscale_ first and let step() skip it.
//
// Parameters without a gradient are skipped. Gradients must all be on one device
// (DeviceError otherwise) and of dtype f64, f32, f16 or bf16.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt {

// Returns the total norm before clipping: a 0-d tensor on the gradients' device,
// f32 (f64 when every gradient is f64). With no gradient at all: 0, on the first
// parameter's device (the CPU for an empty list), and nothing is scaled.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double eps = 1e-6);

}  // namespace mt
