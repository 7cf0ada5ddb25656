// Helpers shared by the LoRA tests (test_lora.cpp, test_lora_adapter.cpp): a GPT-2 shaped toy
// model, LoRA options, B made random (so that the adapters change the output), and a snapshot of
// every parameter and LoRA path, which is what "the model was left unchanged" is checked against.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/nn/layers.h"
#include "ops/nn/lora.h"
#include "ops/nn/module.h"
#include "ops/ops.h"

namespace mt::nn::lora_test {

// A GPT-2 shaped toy: attn.c_attn, attn.c_proj, ln, mlp.c_fc, mlp.c_proj (no bias).
class Attn : public Module {
 public:
  Attn() {
    register_module("c_attn", c_attn, std::make_shared<Linear>(LinearOptions(8, 24)));
    register_module("c_proj", c_proj, std::make_shared<Linear>(LinearOptions(24, 8)));
  }
  Tensor forward(const Tensor& x) const { return c_proj->forward(gelu(c_attn->forward(x))); }
  std::shared_ptr<Linear> c_attn, c_proj;
};

class Mlp : public Module {
 public:
  Mlp() {
    register_module("c_fc", c_fc, std::make_shared<Linear>(LinearOptions(8, 32)));
    register_module("c_proj", c_proj, std::make_shared<Linear>(LinearOptions(32, 8).bias(false)));
  }
  Tensor forward(const Tensor& x) const { return c_proj->forward(gelu(c_fc->forward(x))); }
  std::shared_ptr<Linear> c_fc, c_proj;
};

class Tiny : public Module {
 public:
  explicit Tiny(uint64_t seed, DType dtype = DType::f32) {
    manual_seed(seed);
    register_module("attn", attn, std::make_shared<Attn>());
    register_module("ln", ln, std::make_shared<LayerNorm>(8));
    register_module("mlp", mlp, std::make_shared<Mlp>());
    to(dtype);
  }
  Tensor forward(const Tensor& x) const { return mlp->forward(ln->forward(add(x, attn->forward(x)))); }  // [N, 8]
  std::shared_ptr<Attn> attn;
  std::shared_ptr<LayerNorm> ln;
  std::shared_ptr<Mlp> mlp;
};

inline LoRAOptions lora_options(int64_t r, double alpha, std::vector<std::string> targets) {
  LoRAOptions o;
  o.r = r;
  o.alpha = alpha;
  o.target_modules = std::move(targets);
  return o;
}

inline const std::vector<std::string> kAllLinears = {"c_attn", "c_proj", "c_fc"};

inline void randomize_b(Module& model, double stddev = 0.1) {
  for (const auto& [path, layer] : lora_layers(model))
    layer->lora_B->weight.copy_(randn(layer->lora_B->weight.shape()) * stddev);
}

inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Every parameter's values and requires_grad, and the module paths: what "unchanged" means.
struct Snapshot {
  std::map<std::string, std::pair<std::vector<double>, bool>> params;
  std::vector<std::string> lora_paths;
  bool operator==(const Snapshot& o) const { return params == o.params && lora_paths == o.lora_paths; }
};

inline Snapshot snapshot(const Module& m) {
  Snapshot s;
  for (const auto& [name, t] : m.named_parameters()) s.params[name] = {values(t), t.requires_grad()};
  for (const auto& [path, layer] : lora_layers(m)) s.lora_paths.push_back(path);
  return s;
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// "head" has a member slot, "fc" has none: the first replacement succeeds, the second
// cannot, and the first must be undone.
class HalfSlotted : public Module {
 public:
  HalfSlotted() {
    register_module("head", head, std::make_shared<Linear>(LinearOptions(4, 4)));
    fc = register_module("fc", std::make_shared<Linear>(LinearOptions(4, 4)));
  }
  std::shared_ptr<Linear> head, fc;
};

}  // namespace mt::nn::lora_test
