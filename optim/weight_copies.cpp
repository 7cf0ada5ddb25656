#include "optim/weight_copies.h"

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace mt {

AutocastWeightCopies::AutocastWeightCopies(std::optional<DType> dtype, const void* provider, size_t params)
    : dtype_(dtype), provider_(provider), slots_(params) {
  MT_CHECK_T(DTypeError, !dtype || is_half(*dtype),
             "AdamW: autocast_copies must be f16 or bf16 (an autocast region's dtype), got ",
             dtype_name(dtype.value_or(DType::f32)));
}

bool AutocastWeightCopies::prepared_capture() const { return autocast::serves_in_capture(provider_); }

Tensor AutocastWeightCopies::for_step(size_t slot, const Tensor& p, bool prepared_capture) {
  Slot& s = slots_.at(slot);
  if (!dtype_ || p.dtype() != DType::f32 || s.off) return Tensor();
  // Note [Provided copies]: a capture writes the copies only where its replays are prepared,
  // and only into copies an eager step made (their memory must outlive the graph).
  if (cuda::capturing() && (!prepared_capture || !s.copy.defined())) {
    autocast::withdraw_copy(p, *dtype_);
    // The replays rewrite p and no copy: a graph that reads the copy needs it cast again
    // before each of its replays. Replays that nobody prepares rewrite p whenever they run,
    // so that from now on no copy of p can be known to be current outside a replay either:
    // steps make none (the copy is kept only for graphs already captured to read).
    s.recast_before_replay = true;
    if (!prepared_capture) s.off = true;
    return Tensor();
  }
  if (!s.copy.defined()) s.copy = empty(p.shape(), TensorOptions().dtype(*dtype_).device(p.device()));
  return s.copy;
}

void AutocastWeightCopies::updated(size_t slot, const Tensor& p) {
  Slot& s = slots_.at(slot);
  if (p.is_cuda()) {
    s.copy.bump_version();  // the update kernel writes it beside p
  } else {
    NoGradGuard no_grad;
    s.copy.copy_(p);  // copy_ moves the version itself
  }
}

void AutocastWeightCopies::hand_over(size_t slot, const Tensor& p) { provide(slots_.at(slot), p); }

void AutocastWeightCopies::provide(Slot& s, const Tensor& p) const {
  s.version = p.version();
  s.storage = p.storage();
  autocast::provide_copy(p, s.copy, provider_);
}

bool AutocastWeightCopies::fits(const Slot& s, const Tensor& p) {
  return s.copy.defined() && p.dtype() == DType::f32 && p.shape() == s.copy.shape() && p.device() == s.copy.device();
}

bool AutocastWeightCopies::current(const Slot& s, const Tensor& p) {
  return p.version() == s.version && s.storage.lock() == p.storage();
}

void AutocastWeightCopies::prepare_replay(size_t slot, const Tensor& p) {
  // Note [Provided copies]. The replay reads the copies and rewrites them beside the
  // parameters. A copy is current while its parameter's version is the one it was written
  // at; a parameter written since (a load, an in-place edit), or one that the captured step
  // writes after its update (recast_before_replay), has its copy cast again here first. The
  // replay moves no version: moved here, and the copies provided anew, so that what autocast
  // serves and what saved tensors check describe the tensors as the replay leaves them; but
  // not the copies of parameters the step writes after the update (an eager step after the
  // replay casts those).
  Slot& s = slots_.at(slot);
  if (!s.copy.defined()) return;
  NoGradGuard no_grad;
  if (!fits(s, p)) {  // Module::to() gave the parameter another dtype or device: no copy now
    autocast::withdraw_copy(p, s.copy.dtype());
    s.copy = Tensor();
    return;
  }
  if (s.recast_before_replay || !current(s, p)) s.copy.copy_(p);
  p.bump_version();
  s.copy.bump_version();
  if (s.recast_before_replay) {
    autocast::withdraw_copy(p, s.copy.dtype());
  } else {
    provide(s, p);
  }
}

void AutocastWeightCopies::after_capture(size_t slot, const Tensor& p) {
  Slot& s = slots_.at(slot);
  if (s.copy.defined() && !current(s, p)) s.recast_before_replay = true;
}

}  // namespace mt
