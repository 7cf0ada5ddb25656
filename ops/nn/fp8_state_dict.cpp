#include "ops/nn/fp8_state_dict.h"

#include <memory>
#include <set>
#include <utility>
#include <vector>

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

}  // namespace mt::nn
