#include "ops/nn/fp8_state_dict.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "core/view.h"
#include "ops/nn/layers.h"

namespace mt::nn {

namespace {

// Every Linear below `module` (and the module itself), first path first, each once.
std::vector<std::pair<std::string, Linear*>> linears(const Module& module) {
  std::vector<std::pair<std::string, Linear*>> out;
  std::set<const Module*> seen;
  const auto add = [&](const std::string& path, const Module* m) {
    auto* linear = dynamic_cast<Linear*>(const_cast<Module*>(m));
    if (linear != nullptr && seen.insert(m).second) out.emplace_back(path, linear);
  };
  add("", &module);
  for (const auto& [path, child] : module.named_modules()) add(path, child.get());
  return out;
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

// The state keys an entry may end with (Fp8LinearState::state_dict's).
const std::vector<std::string>& state_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = {"recipe"};
    for (const char* t : {"input", "weight", "grad_output"}) {
      for (const char* f : {"amax_history", "scale", "scale_inv"}) k.push_back(std::string(t) + "." + f);
    }
    return k;
  }();
  return keys;
}

// A layer's delayed-scaling tensor states (none under current scaling).
std::vector<const Fp8TensorState*> delayed_states(const Fp8LinearState& s) {
  if (s.recipe.scaling != Fp8Recipe::Scaling::delayed) return {};
  return {&s.input, &s.weight, &s.grad_output};
}

// The states whose scale fp8_health reads: every delayed one, and the current ones that have cast.
std::vector<const Fp8TensorState*> states_with_scales(const Fp8LinearState& s) {
  if (s.recipe.scaling == Fp8Recipe::Scaling::delayed) return delayed_states(s);
  std::vector<const Fp8TensorState*> cast;
  for (const Fp8TensorState* t : {&s.input, &s.weight, &s.grad_output}) {
    if (t->last_scale.defined()) cast.push_back(t);
  }
  return cast;
}

// `s` with its own copies of the state tensors and an empty weight cache: the copy casts its
// weight again rather than trust an entry across a CUDA Graph's replays, which change the weights
// without a new version (Note [FP8 weight cache]).
std::shared_ptr<Fp8LinearState> detached_copy(const Fp8LinearState& s) {
  auto copy = std::make_shared<Fp8LinearState>(s);
  for (Fp8TensorState* t : {&copy->input, &copy->weight, &copy->grad_output}) {
    for (Tensor* field : {&t->amax_history, &t->scale, &t->scale_inv, &t->overflows, &t->last_scale}) {
      if (field->defined()) *field = raw::clone(*field);
    }
  }
  copy->weight_cache = Fp8WeightCache();
  return copy;
}

}  // namespace

std::map<std::string, Tensor> fp8_state_dict(const Module& module) {
  std::map<std::string, Tensor> out;
  for (const auto& [path, linear] : linears(module)) {
    if (!linear->fp8_state) continue;
    for (const auto& [key, t] : linear->fp8_state->state_dict()) out[join(path, key)] = t;
  }
  return out;
}

void load_fp8_state_dict(Module& module, const std::map<std::string, Tensor>& state) {
  const std::vector<std::pair<std::string, Linear*>> layers = linears(module);
  std::map<std::string, std::map<std::string, Tensor>> per_layer;
  for (const auto& [name, t] : state) {
    bool matched = false;
    for (const auto& [path, linear] : layers) {
      for (const std::string& key : state_keys()) {
        if (name == join(path, key)) {
          per_layer[path][key] = t;
          matched = true;
        }
      }
    }
    MT_CHECK(matched, "load_fp8_state_dict: unexpected key '", name, "' (no Linear layer of the model has it)");
  }
  std::vector<std::shared_ptr<Fp8LinearState>> made;  // all checked before any layer changes
  for (const auto& [path, linear] : layers) {
    const auto it = per_layer.find(path);
    if (it == per_layer.end()) {
      made.push_back(nullptr);
      continue;
    }
    try {
      auto s = std::make_shared<Fp8LinearState>(Fp8LinearState::saved_recipe(it->second), linear->weight.device());
      s->load_state_dict(it->second);
      made.push_back(std::move(s));
    } catch (const Error& e) {
      throw Error(detail::str_cat("load_fp8_state_dict: layer '", path, "': ", e.what()));
    }
  }
  for (size_t i = 0; i < layers.size(); ++i) layers[i].second->fp8_state = made[i];
}

Fp8Health fp8_health(const Module& module) {
  Fp8Health health;
  // Per device: the states' scales, then their counters, as f64 in one tensor (exact for both).
  std::vector<std::pair<Device, std::vector<const Fp8TensorState*>>> by_device;
  for (const auto& [path, linear] : linears(module)) {
    if (!linear->fp8_state) continue;
    ++health.layers;
    const std::vector<const Fp8TensorState*> states = states_with_scales(*linear->fp8_state);
    if (states.empty()) continue;
    const Device device = linear->fp8_state->device;
    auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& d) { return d.first == device; });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {device, {}});
    it->second.insert(it->second.end(), states.begin(), states.end());
  }
  for (const auto& [device, states] : by_device) {
    const auto n = static_cast<int64_t>(states.size());
    const Tensor values = empty({2 * n}, TensorOptions().dtype(DType::f64).device(device));
    for (int64_t i = 0; i < n; ++i) {
      const Fp8TensorState& state = *states[static_cast<size_t>(i)];
      const bool delayed = state.scale.defined();
      raw::narrow(values, 0, i, 1).copy_(delayed ? state.scale : state.last_scale);
      if (delayed) {
        raw::narrow(values, 0, n + i, 1).copy_(state.overflows);
      } else {
        raw::narrow(values, 0, n + i, 1).fill_(0.0);  // current scaling: never saturated
      }
    }
    const std::vector<double> host = values.to_vector<double>();
    for (int64_t i = 0; i < n; ++i) {
      const double scale = host[static_cast<size_t>(i)];
      health.min_scale = health.states == 0 ? scale : std::min(health.min_scale, scale);
      health.max_scale = health.states == 0 ? scale : std::max(health.max_scale, scale);
      health.overflows += static_cast<int64_t>(host[static_cast<size_t>(n + i)]);
      ++health.states;
    }
  }
  return health;
}

Fp8StateRestoreGuard::Fp8StateRestoreGuard(const Module& module) {
  for (const auto& [path, linear] : linears(module)) {
    originals_.emplace_back(linear, linear->fp8_state);
    if (linear->fp8_state) linear->fp8_state = detached_copy(*linear->fp8_state);
  }
}

Fp8StateRestoreGuard::~Fp8StateRestoreGuard() {
  for (auto& [linear, state] : originals_) linear->fp8_state = std::move(state);
}

}  // namespace mt::nn
