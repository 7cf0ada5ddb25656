// Autocast: inside an AutocastGuard, ops run in the precision their numerics
// allow, as PyTorch's CUDA autocast policy does (aten/src/ATen/autocast_mode.h):
//
//   { mt::AutocastGuard amp(mt::DeviceType::cuda, mt::DType::bf16);
//     auto loss = mt::cross_entropy(model(x), y); }   // GEMMs in bf16, the loss in f32
//   loss.backward();                                   // outside the region, as in PyTorch
//
// The policy (one table, autograd/autocast_policy.cpp, printed in the README):
//   lower_precision: matmul, bmm, linear, conv2d, attention   -> the region's dtype
//   fp32: exp, log, pow, rsqrt, softplus, layer_norm, rms_norm, softmax,
//         log_softmax, cross_entropy (every loss), sum, mean, var, norms -> f32
//   promote: add, sub, mul, div, cat, stack, where            -> the widest input dtype
//   anything else runs in its inputs' dtype.
// Only f32 tensors are cast to the low dtype, and only f16/bf16 ones up to f32:
// f64 and integer tensors are never touched. Casts are recorded before the op,
// so backward sees the low-precision saved tensors and the gradient of a cast
// input comes back in the input's own dtype. The GEMM ops with parameters (linear,
// linear_gelu, mlp_gelu, lora_linear, linear_cross_entropy) take their parameters' copies
// unrecorded (operand_copies) and write those parameters' gradients in their own
// dtype themselves: an f32 weight gets its gradient from the GEMM in f32, never
// rounded to bf16 and widened by a second pass.
//
// Note [Autocast cast cache]
// A leaf f32 parameter that requires grad is cast once per region and dtype:
// the cast is cached by tensor identity and storage version, so an in-place
// update (an optimizer step inside the region) invalidates it (the bug of
// PyTorch issues 65766 and 158232). The cache is cleared when the outermost
// region exits, except for the copies operand_copies made of frozen f32 leaves
// (requires_grad false: a LoRA base's weights, a frozen tied embedding): those stay
// for the next region while their tensor lives, is unchanged (same version) and
// stays frozen, so a frozen base is cast once, not at every step. They cost the
// memory of one low-precision copy per frozen weight, and are dropped when their
// tensor is freed (at the next region's start or end). A CUDA Graph capture keeps
// none: its replays cast the weights as they are at each replay.
//
// Note [Provided copies]
// An optimizer that writes each f32 parameter's low-precision copy in the same pass as
// its update (AdamWOptions::autocast_copies) hands the copy over with provide_copy();
// operand_copies then serves it in place of a cast, from region to region, while the
// parameter is the same tensor with the same storage and version as when it was
// provided. So a training step casts no weight: the copy costs the update 2 bytes a
// parameter, where a cast reads 4 and writes 2 in a launch of its own. Like the cache,
// it serves the thread that provided it.
// Inside a CUDA Graph capture a copy serves only under ServeCopiesInCapture, which
// CudaGraphStep opens, and only if its optimizer is one that CudaGraphStep prepares for
// every replay (it was provided kept_current_between_replays). The captured forward then
// reads the copies' memory, and the captured update rewrites them beside the parameters,
// so that each replay leaves them current for the next. Before every replay the
// optimizer's prepare_replay() casts again the copy of any parameter written since its
// copy was (a load, an in-place edit: the version tells), then moves the parameters'
// versions (a replay rewrites them behind the host's back) and provides the copies anew.
// Any other capture has no such promise: it casts the weights, and an optimizer stepping
// inside it withdraws its copies (withdraw_copy).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace mt {

class AutocastGuard {
 public:
  // dtype must be f16 or bf16. enabled = false opens an f32 sub-region.
  AutocastGuard(DeviceType device_type, DType dtype, bool enabled = true);
  explicit AutocastGuard(DeviceType device_type, bool enabled) : AutocastGuard(device_type, DType::bf16, enabled) {}
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool previous_enabled_;
  DType previous_dtype_;
};

namespace autocast {

enum class CastPolicy { lower_precision, fp32, promote, none };

bool is_enabled(DeviceType device_type);
DType dtype(DeviceType device_type);
CastPolicy policy_for(const char* op);
// (op, policy) for every op the table names, in table order (documentation, tests).
std::vector<std::pair<const char*, CastPolicy>> policy_table();
const char* policy_name(CastPolicy policy);

// Applies the policy of `op` to its floating inputs (others pass through).
std::vector<Tensor> cast_inputs(const char* op, std::vector<Tensor> inputs);
Tensor cast_input(const char* op, const Tensor& input);
// The same casts, made as plain copies that record nothing (cached alike). For an op that
// records the original tensors as its inputs and writes their gradients in their own dtype
// itself: linear and its fused forms give an f32 parameter its gradient straight from the
// GEMM in f32, with no bf16 gradient for a Cast node to widen afterwards.
std::vector<Tensor> operand_copies(const char* op, std::vector<Tensor> inputs);

// Note [Provided copies]: `copy` (f16 or bf16, source's shape) holds the f32 leaf `source`
// rounded to copy's dtype as source is now; operand_copies serves it until source changes.
// kept_current_between_replays: the provider prepares every replay of the graph being
// captured (ServeCopiesInCapture), so that the capture may read the copy too.
void provide_copy(const Tensor& source, const Tensor& copy, bool kept_current_between_replays = false);
// Stops serving source's provided copy in `dtype`, if there is one.
void withdraw_copy(const Tensor& source, DType dtype);

// While one lives (on this thread), a CUDA Graph capture serves provided copies and an
// optimizer writes its copies in the captured step: its opener promises to call each
// optimizer's prepare_replay() before every replay (Note [Provided copies]).
class ServeCopiesInCapture {
 public:
  ServeCopiesInCapture();
  ~ServeCopiesInCapture();
  ServeCopiesInCapture(const ServeCopiesInCapture&) = delete;
  ServeCopiesInCapture& operator=(const ServeCopiesInCapture&) = delete;
};
bool copies_served_in_capture();

// Number of casts autocast has made on this thread (tests count cache hits with it).
uint64_t cast_count();

}  // namespace autocast
}  // namespace mt
