// The low-precision copies an optimizer writes of its f32 parameters for autocast
// (AdamWOptions::autocast_copies; Note [Provided copies] in autograd/autocast.h): the one owner
// of their state. For each parameter it keeps the copy (f16 or bf16, the parameter's shape, made
// at its first step), the parameter's storage and version when the copy was last written, and
// two facts learnt from CUDA Graph captures: whether replays leave the copy behind (the copy is
// then cast again before each replay), and whether a capture nobody prepares took the update
// (no step writes the copy again). autocast sees only provide_copy / withdraw_copy.
//
// The optimizer's step asks for_step() for the copy its update kernel writes beside the
// parameter, calls updated() after each update and hand_over() once every update is launched;
// CudaGraphStep reaches prepare_replay() and after_capture() through Optimizer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace mt {

class AutocastWeightCopies {
 public:
  // dtype: f16 or bf16, or none (no copies: every call below is a no-op); provider: who provides
  // the copies, as autocast knows it (ServeCopiesInCapture names it); params: one slot each.
  AutocastWeightCopies(std::optional<DType> dtype, const void* provider, size_t params);

  bool enabled() const { return dtype_.has_value(); }
  // Whether the capture in progress (if any) is a CudaGraphStep's that prepares this provider's replays.
  bool prepared_capture() const;
  // The copy that this step's update of p (slot `slot`) writes, made at p's first step; undefined
  // where p takes none: not f32, copies off, or a capture that does not serve them (which only
  // records what its replays will leave behind).
  Tensor for_step(size_t slot, const Tensor& p, bool prepared_capture);
  // p's update has run (CPU: the copy is cast here) or is queued with the copy's (CUDA): the
  // copy's version moves, so that a graph that saved the old copy cannot run on the new one.
  void updated(size_t slot, const Tensor& p);
  // Every update of the step is launched: autocast serves the copy from now on. (Not before: a
  // step that threw before its kernels must not leave autocast a copy never written.)
  void hand_over(size_t slot, const Tensor& p);
  // Before a replay: the copy of a parameter written since its copy was (a load, an in-place
  // edit), or one the captured step leaves behind, is cast again; versions move as the replay
  // will move them, and the copies are provided anew.
  void prepare_replay(size_t slot, const Tensor& p);
  // After a capture: a parameter whose version moved after its copy was provided is written by
  // the captured step after its update, so each replay leaves its copy behind (for good).
  void after_capture(size_t slot, const Tensor& p);

  const Tensor& copy(size_t slot) const { return slots_.at(slot).copy; }

 private:
  struct Slot {
    Tensor copy;
    std::weak_ptr<Storage> storage;  // the parameter's, when the copy was last written
    uint64_t version = 0;            // the parameter's version then
    bool recast_before_replay = false;
    bool off = false;
  };
  void provide(Slot& s, const Tensor& p) const;
  static bool fits(const Slot& s, const Tensor& p);     // defined, and p still f32 of the copy's shape and device
  static bool current(const Slot& s, const Tensor& p);  // written from p as p is now

  std::optional<DType> dtype_;
  const void* provider_;
  std::vector<Slot> slots_;
};

}  // namespace mt
