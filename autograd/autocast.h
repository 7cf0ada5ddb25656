// Autocast: inside an AutocastGuard, ops run in the precision their numerics
// allow, as PyTorch's CUDA autocast policy does (aten/src/ATen/autocast_mode.h):
//
//   { mt::AutocastGuard amp(mt::DeviceType::cuda, mt::DType::bf16);
//     auto loss = mt::cross_entropy(model(x), y); }   // GEMMs in bf16, the loss in f32
//   loss.backward();                                   // outside the region, as in PyTorch
//
// Each op named in the policy table (autograd/autocast_policy.cpp, the one source; its
// documented copy is docs/numerics.md, checked against it by a test) runs in the region's
// low dtype (lower_precision), in f32 (fp32) or in its widest input dtype (promote);
// any other op runs in its inputs' dtype.
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
// its update (AdamWOptions::autocast_copies; the copies and their state are owned by one
// mt::AutocastWeightCopies in optim/weight_copies.h) hands the copy over with provide_copy();
// operand_copies then serves it in place of a cast, from region to region, while the
// parameter is the same tensor with the same storage and version as when it was
// provided. So a training step casts no weight: the copy costs the update 2 bytes a
// parameter, where a cast reads 4 and writes 2 in a launch of its own. Like the cache,
// it serves the thread that provided it.
// Inside a CUDA Graph capture a copy serves only under a ServeCopiesInCapture that names
// its provider: CudaGraphStep opens one naming its optimizers, whose prepare_replay() it
// calls before every replay. The captured forward then reads the copies' memory, and the
// captured update rewrites them beside the parameters, so that each replay leaves them
// current for the next. prepare_replay() casts again the copy of any parameter written
// since its copy was (a load, an in-place edit: the version tells) or written by the
// captured step after its update (a clamp, say: seen when the capture ends), then moves
// the versions of the parameters and copies (a replay rewrites them behind the host's
// back) and provides the copies anew. Any other capture has no such promise: it casts the
// weights, and an optimizer stepping inside it withdraws its copies (withdraw_copy).
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
// `provider` (the optimizer) is who keeps it current: a capture serves the copy only under a
// ServeCopiesInCapture that names it.
void provide_copy(const Tensor& source, const Tensor& copy, const void* provider = nullptr);
// Stops serving source's provided copy in `dtype`, if there is one.
void withdraw_copy(const Tensor& source, DType dtype);

// While one lives (on this thread, innermost first), a CUDA Graph capture serves the copies
// that `providers` provided, and they write their copies in the captured step: its opener
// promises that each of them keeps its copies current before every replay (Note [Provided
// copies]; CudaGraphStep and Optimizer::prepare_replay).
class ServeCopiesInCapture {
 public:
  explicit ServeCopiesInCapture(std::vector<const void*> providers);
  ~ServeCopiesInCapture();
  ServeCopiesInCapture(const ServeCopiesInCapture&) = delete;
  ServeCopiesInCapture& operator=(const ServeCopiesInCapture&) = delete;

 private:
  friend bool serves_in_capture(const void* provider);
  std::vector<const void*> providers_;
  const ServeCopiesInCapture* outer_;
};
// Whether a capture is in progress under a ServeCopiesInCapture that names `provider`.
bool serves_in_capture(const void* provider);

// Number of casts autocast has made on this thread (tests count cache hits with it).
uint64_t cast_count();

}  // namespace autocast
}  // namespace mt
