// Delayed and current FP8 scaling: validation, state, and the device dispatch of the updates.
#include "ops/fp8/fp8_scaling.h"

#include <cmath>
#include <string>

#include "ops/common.h"
#include "ops/fp8/fp8.h"
#include "ops/fp8/fp8_kernels.h"
#include "ops/map.h"

namespace mt {

namespace {

// fp8_max * 2^-margin: exact, being a power-of-two multiple (for any margin that keeps it in range).
float scaled_max(DType format, int margin) { return std::ldexp(fp8_max(format), -margin); }

void check_amax(const char* op, const Tensor& amax, Device device) {
  ops::check_defined(op, amax, "amax");
  MT_CHECK_T(DTypeError, amax.dtype() == DType::f32 && amax.numel() == 1, op,
             ": the amax must be an f32 tensor with one element, got ", ops::describe(amax));
  MT_CHECK_T(DeviceError, amax.device() == device, op, ": the amax is on ", amax.device().str(),
             " but the state is on ", device.str());
}

// fp8_max plus half its ulp (464 for E4M3, 61440 for E5M2): a product up to it rounds to fp8_max
// as it would in a format with more range; beyond it the cast saturates.
float saturation_bound(DType format) {
  const float max = fp8_max(format);
  return format == DType::f8e4m3 ? max + 16.0f : max + 4096.0f;
}

constexpr const char* kKeys[] = {"amax_history", "scale", "scale_inv"};

}  // namespace

Fp8TensorState::Fp8TensorState(const DelayedScaling& r, Device device) : recipe(r) {
  MT_CHECK(recipe.history_len >= 1, "Fp8TensorState: history_len must be at least 1, got ", recipe.history_len);
  fp8_max(recipe.format);  // throws for a format that is not FP8
  const TensorOptions f32 = TensorOptions().dtype(DType::f32).device(device);
  amax_history = zeros({recipe.history_len}, f32);
  scale = ones({1}, f32);
  scale_inv = ones({1}, f32);
  overflows = zeros({1}, TensorOptions().dtype(DType::i64).device(device));
}

void Fp8TensorState::update(const Tensor& new_amax) {
  const char* op = "Fp8TensorState::update";
  MT_CHECK(amax_history.defined(), op, ": the state was default-constructed (give it a recipe and a device)");
  check_amax(op, new_amax, amax_history.device());
  // The fields are public: the kernels' assumptions are checked here.
  const Device device = amax_history.device();
  MT_CHECK(
      amax_history.dtype() == DType::f32 && amax_history.is_contiguous() && amax_history.numel() == recipe.history_len,
      op, ": amax_history must be a contiguous f32 [", recipe.history_len, "], got ", ops::describe(amax_history));
  for (const Tensor* t : {&scale, &scale_inv}) {
    MT_CHECK(t->defined() && t->dtype() == DType::f32 && t->numel() == 1 && t->device() == device, op,
             ": scale and scale_inv must be f32 with one element on ", device.str(), ", got ",
             t->defined() ? ops::describe(*t) : std::string("an undefined tensor"));
  }
  MT_CHECK(
      overflows.defined() && overflows.dtype() == DType::i64 && overflows.numel() == 1 && overflows.device() == device,
      op, ": overflows must be i64 with one element on ", device.str(), ", got ",
      overflows.defined() ? ops::describe(overflows) : std::string("an undefined tensor"));
  ops::DelayedUpdate u;
  u.history = amax_history;
  u.scale = scale;
  u.scale_inv = scale_inv;
  u.new_amax = new_amax;
  u.overflows = overflows;
  u.most_recent = recipe.amax_compute == DelayedScaling::Amax::most_recent;
  u.scaled_max = scaled_max(recipe.format, recipe.margin);
  u.saturation_bound = saturation_bound(recipe.format);
  if (amax_history.is_cuda()) {
#if MT_WITH_CUDA
    ops::delayed_update_cuda(u);
#else
    ops::throw_no_cuda(op);
#endif
  } else {
    ops::delayed_update_cpu(u);
  }
  for (const Tensor& t : {amax_history, scale, scale_inv, overflows}) t.bump_version();
}

std::map<std::string, Tensor> Fp8TensorState::state_dict() const {
  return {{kKeys[0], amax_history}, {kKeys[1], scale}, {kKeys[2], scale_inv}};
}

void Fp8TensorState::load_state_dict(const std::map<std::string, Tensor>& state) {
  const char* op = "Fp8TensorState::load_state_dict";
  MT_CHECK(amax_history.defined(), op, ": the state was default-constructed (give it a recipe and a device)");
  for (const auto& [key, value] : state) {
    const bool known = key == kKeys[0] || key == kKeys[1] || key == kKeys[2];
    MT_CHECK(known, op, ": unexpected key '", key, "' (expected amax_history, scale, scale_inv)");
  }
  const std::map<std::string, Tensor> mine = state_dict();
  for (const auto& [key, target] : mine) {
    const auto it = state.find(key);
    MT_CHECK(it != state.end(), op, ": missing key '", key, "'");
    const Tensor& value = it->second;
    MT_CHECK_T(ShapeError, value.defined() && value.numel() == target.numel(), op, ": '", key, "' must have ",
               target.numel(), " elements (", shape_str(target.shape()), "), got ",
               value.defined() ? ops::describe(value) : std::string("an undefined tensor"));
    check_loadable(op, key, value.dtype(), DType::f32);
    target.copy_(raw::reshape(value, target.shape()));
  }
}

Fp8Scale current_scale(const Tensor& amax, DType format, int margin) {
  const char* op = "current_scale";
  ops::check_defined(op, amax, "amax");  // before amax.device() is read below
  check_amax(op, amax, amax.device());
  const float limit = scaled_max(format, margin);
  const TensorOptions f32 = TensorOptions().dtype(DType::f32).device(amax.device());
  Fp8Scale s{empty({1}, f32), empty({1}, f32)};
  if (amax.is_cuda()) {
#if MT_WITH_CUDA
    ops::current_scale_cuda(amax, s.scale, s.scale_inv, limit);
#else
    ops::throw_no_cuda(op);
#endif
  } else {
    ops::current_scale_cpu(amax, s.scale, s.scale_inv, limit);
  }
  return s;
}

}  // namespace mt
