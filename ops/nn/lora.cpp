#include "ops/nn/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <typeinfo>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/atomic_file.h"
#include "core/format.h"
#include "core/safetensors.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/fp8/fp8_rowwise.h"
#include "ops/matmul/matmul.h"
#include "ops/nn/adapter_config.h"
#include "ops/shape/shape.h"

namespace mt::nn {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kKeyPrefix = "base_model.model.";
constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

// Validates the per-layer knobs and returns the branch's scale.
double checked_scale(const LoRAOptions& o, const char* fn) {
  MT_CHECK(o.r > 0, fn, ": r must be positive, got ", o.r);
  MT_CHECK(std::isfinite(o.alpha), fn, ": alpha must be finite, got ", o.alpha);
  MT_CHECK(o.dropout >= 0 && o.dropout < 1, fn, ": dropout must lie in [0, 1), got ", o.dropout);
  return o.use_rslora ? o.alpha / std::sqrt(static_cast<double>(o.r)) : o.alpha / static_cast<double>(o.r);
}

std::string join(const std::vector<std::string>& items, size_t limit = SIZE_MAX) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += ", ... (" + std::to_string(items.size() - limit) + " more)";
  return out;
}

std::vector<std::string> sorted_targets(const LoRAOptions& o) {
  std::vector<std::string> t = o.target_modules;
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

std::string describe_targets(const LoRAOptions& o) {
  if (!o.target_regex.empty()) return "regex '" + o.target_regex + "'";
  return "[" + join(sorted_targets(o)) + "]";
}

// PEFT's check_target_module_exists: a list matches a path equal to a name or ending
// with "." + name; a regex string must match the whole path.
class TargetMatcher {
 public:
  explicit TargetMatcher(const LoRAOptions& o) : names_(o.target_modules), use_regex_(!o.target_regex.empty()) {
    MT_CHECK(use_regex_ != !names_.empty(), "apply_lora: give target_modules or target_regex (exactly one), got ",
             names_.size(), " target module names and ", use_regex_ ? "a" : "no", " regex");
    for (const std::string& name : names_) MT_CHECK(!name.empty(), "apply_lora: a target module name is empty");
    if (!use_regex_) return;
    try {
      regex_ = std::regex(o.target_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error(detail::str_cat("apply_lora: target_regex '", o.target_regex, "' is not a valid regex: ", e.what()));
    }
  }
  bool matches(const std::string& path) const {
    if (use_regex_) return std::regex_match(path, regex_);
    for (const std::string& name : names_) {
      if (path == name) return true;
      if (path.size() > name.size() && path.compare(path.size() - name.size(), name.size(), name) == 0 &&
          path[path.size() - name.size() - 1] == '.')
        return true;
    }
    return false;
  }

 private:
  std::vector<std::string> names_;
  bool use_regex_;
  std::regex regex_;
};

// One Linear that apply_lora will replace: where it hangs and what it is.
struct Target {
  std::string path;
  Module* parent;
  std::string name;  // within the parent
  std::shared_ptr<Linear> base;
};

// Everything apply_lora checks, with nothing changed: the Linear layers to replace.
std::vector<Target> plan_lora(Module& model, const LoRAOptions& options) {
  checked_scale(options, "apply_lora");
  const TargetMatcher matcher(options);
  const auto modules = model.named_modules();
  std::vector<std::string> existing, paths;
  for (const auto& [path, m] : modules) {
    paths.push_back(path);
    if (dynamic_cast<const LoRALinear*>(m.get())) existing.push_back(path);
  }
  MT_CHECK(existing.empty(), "apply_lora: the model already has LoRA layers (", join(existing, 4),
           "); apply_lora runs once per model");
  std::map<std::string, Module*> by_path;
  std::vector<Target> plan;
  for (const auto& [path, m] : modules) {
    by_path[path] = m.get();
    if (!matcher.matches(path)) continue;
    auto linear = std::dynamic_pointer_cast<Linear>(m);
    MT_CHECK(linear != nullptr, "apply_lora: '", path, "' matches the targets ", describe_targets(options),
             " but is not a Linear; only Linear layers can take LoRA");
    const Module& module = *m;
    MT_CHECK(typeid(module) == typeid(Linear), "apply_lora: '", path, "' matches the targets ",
             describe_targets(options), " but is a subclass of Linear, whose own forward a LoRALinear would drop");
    const size_t dot = path.rfind('.');
    Module* parent = dot == std::string::npos ? &model : by_path.at(path.substr(0, dot));
    plan.push_back(Target{path, parent, dot == std::string::npos ? path : path.substr(dot + 1), linear});
  }
  MT_CHECK(!plan.empty(), "apply_lora: no module matches the targets ", describe_targets(options),
           "; the model's modules include: ", paths.empty() ? std::string("(none)") : join(paths, 8));
  return plan;
}

// Replaces the planned layers (restoring them all if one cannot be replaced), then
// freezes every parameter except the adapters'.
void carry_out(Module& model, const std::vector<Target>& plan, const LoRAOptions& options, Generator* generator) {
  std::vector<std::shared_ptr<LoRALinear>> made;
  for (const Target& t : plan) made.push_back(std::make_shared<LoRALinear>(*t.base, options, t.path, generator));
  size_t done = 0;
  try {
    for (; done < plan.size(); ++done) plan[done].parent->replace_module(plan[done].name, made[done]);
  } catch (const Error& e) {
    const std::string failed = plan[done].path;
    while (done > 0) {
      --done;
      plan[done].parent->replace_module(plan[done].name, plan[done].base);
    }
    throw Error(detail::str_cat("apply_lora: cannot put a LoRALinear at '", failed, "' (", e.what(),
                                "); the model was left unchanged"));
  }
  model.freeze();
  for (const auto& layer : made) {
    layer->lora_A->weight.requires_grad_(true);
    layer->lora_B->weight.requires_grad_(true);
  }
}

bool same_config(const LoRAOptions& a, const LoRAOptions& b) {
  return a.r == b.r && a.alpha == b.alpha && a.use_rslora == b.use_rslora && a.target_regex == b.target_regex &&
         sorted_targets(a) == sorted_targets(b);
}

std::string describe_config(const LoRAOptions& o) {
  return detail::str_cat("r = ", o.r, ", alpha = ", o.alpha, ", use_rslora = ", o.use_rslora ? "true" : "false",
                         ", targets ", describe_targets(o));
}

Json config_json(const LoRAOptions& o, const AdapterSaveOptions& save) {
  Json j;
  j["peft_type"] = "LORA";
  j["task_type"] = save.task_type.empty() ? Json(nullptr) : Json(save.task_type);
  j["r"] = o.r;
  // PEFT writes lora_alpha as an int; keep integral values integral.
  if (std::floor(o.alpha) == o.alpha && std::fabs(o.alpha) < 9e15)
    j["lora_alpha"] = static_cast<int64_t>(o.alpha);
  else
    j["lora_alpha"] = o.alpha;
  j["lora_dropout"] = o.dropout;
  j["target_modules"] = o.target_regex.empty() ? Json(sorted_targets(o)) : Json(o.target_regex);
  j["use_rslora"] = o.use_rslora;
  j["bias"] = "none";
  j["fan_in_fan_out"] = save.fan_in_fan_out;
  j["base_model_name_or_path"] = save.base_model_name_or_path ? Json(*save.base_model_name_or_path) : Json(nullptr);
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = Json::object();
  j["alpha_pattern"] = Json::object();
  j["use_dora"] = false;
  j["revision"] = nullptr;
  return j;
}

// ---- loading ----

using detail::fail_adapter_file;

// A LoRA layer the adapter file must fill: its path and the base weight's sizes.
struct AdapterSlot {
  std::string path;
  int64_t out, in;
};

// The slots of a model that already has LoRA, after checking it fits the file's config.
std::vector<AdapterSlot> existing_slots(const Module& model, const LoRAOptions& file_options,
                                        const std::string& config_path) {
  std::vector<AdapterSlot> slots;
  for (const auto& [path, layer] : lora_layers(model)) {
    if (!same_config(layer->options(), file_options))
      fail_adapter_file(config_path, "the adapter has " + describe_config(file_options) +
                                         " but the model's LoRA layer '" + path + "' has " +
                                         describe_config(layer->options()));
    if (layer->merged())
      fail_adapter_file(config_path, "the model's LoRA layer '" + path +
                                         "' is merged; unmerge_lora first, or the old update stays inside its weight");
    slots.push_back(AdapterSlot{path, layer->weight.size(0), layer->weight.size(1)});
  }
  return slots;
}

void check_adapter_tensors(const std::map<std::string, Tensor>& found, const std::vector<AdapterSlot>& slots, int64_t r,
                           const std::string& path) {
  std::map<std::string, Shape> expected;
  for (const AdapterSlot& s : slots) {
    expected[kKeyPrefix + s.path + ".lora_A.weight"] = Shape{r, s.in};
    expected[kKeyPrefix + s.path + ".lora_B.weight"] = Shape{s.out, r};
  }
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, shape] : expected) {
    if (!found.count(key)) missing.push_back(key);
  }
  for (const auto& [key, t] : found) {
    if (!expected.count(key)) unexpected.push_back(key);
  }
  if (!missing.empty()) {
    std::string problem = "missing key '" + missing.front() + "'" +
                          (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "") +
                          "; keys found that the model does not expect: " +
                          (unexpected.empty() ? std::string("none") : join(unexpected, 4));
    for (const std::string& key : unexpected) {
      if (key.find(".default.") == std::string::npos) continue;
      problem +=
          " (keys with the adapter name, '.default.', come from an unsaved PEFT state dict; PEFT strips it on "
          "save)";
      break;
    }
    fail_adapter_file(path, problem);
  }
  if (!unexpected.empty())
    fail_adapter_file(path,
                      "unexpected key '" + unexpected.front() + "'" +
                          (unexpected.size() > 1 ? " (and " + std::to_string(unexpected.size() - 1) + " more)" : "") +
                          ": the model has no LoRA weight of that name");
  for (const auto& [key, shape] : expected) {
    const Tensor& t = found.at(key);
    if (t.shape() != shape)
      fail_adapter_file(path, "'" + key + "' has shape " + shape_str(t.shape()) + " in the file but " +
                                  shape_str(shape) + " in the model");
    if (!is_floating(t.dtype()))
      fail_adapter_file(path,
                        "'" + key + "' has dtype " + dtype_name(t.dtype()) + "; adapter weights must be floating");
  }
}

}  // namespace

// ---- LoRALinear ----

LoRALinear::LoRALinear(const Linear& base, const LoRAOptions& options, std::string path, Generator* generator)
    : Linear(base.weight, base.bias, base.weight_scale_inv),
      options_(options),
      path_(std::move(path)),
      scale_(checked_scale(options, "LoRALinear")) {
  weight.requires_grad_(false);  // a fresh handle on the base's storage: no gradient buffer either
  if (bias.defined()) bias.requires_grad_(false);
  const int64_t out = weight.size(0), in = weight.size(1);
  // The factors are f32 over a half-precision base (as PEFT's autocast_adapter_dtype makes them):
  // they are what AdamW updates, and a bf16 parameter loses any step below half its ulp.
  const DType adapter_dtype = weight.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const TensorOptions like = TensorOptions().dtype(adapter_dtype).device(weight.device());
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  lora_A = register_module(
      "lora_A", std::make_shared<Linear>(uniform({options_.r, in}, -bound, bound, like, generator), Tensor()));
  lora_B = register_module("lora_B", std::make_shared<Linear>(zeros({out, options_.r}, like), Tensor()));
}

Tensor LoRALinear::forward(const Tensor& x) const { return forward_as(x, OutputValues::computed); }

Tensor LoRALinear::forward_unread(const Tensor& x) const { return forward_as(x, OutputValues::unread); }

Tensor LoRALinear::forward_as(const Tensor& x, OutputValues values) const {
  const auto scope = trace_scope();
  if (merged_) return linear(x, weight, bias);                   // [..., out]
  const Tensor h = dropout(x, options_.dropout, is_training());  // x itself when p = 0 or in eval
  // One op: the adapter's product is added onto the base's output by its last GEMM.
  const Tensor y = has_fp8_weight() ? fp8_lora_linear(x, h, weight, weight_scale_inv, bias, lora_A->weight,
                                                      lora_B->weight, scale_, values)
                                    : lora_linear(x, h, weight, bias, lora_A->weight, lora_B->weight, scale_, values);
  // Outside autocast, f32 factors over a half-precision base would widen the layer's output and
  // everything after it: the output keeps the base's dtype, as the layer without adapters (PEFT too).
  // An FP8 base computes in x's dtype.
  if (y.dtype() != x.dtype() && (x.dtype() == weight.dtype() || has_fp8_weight()) &&
      !autocast::is_enabled(x.device().type)) {
    return cast(y, x.dtype());
  }
  return y;
}

Tensor LoRALinear::delta() const {
  const DType dtype = weight.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor a = lora_A->weight.detach().to(weight.device()).to(dtype);  // [r, in]
  const Tensor b = lora_B->weight.detach().to(weight.device()).to(dtype);  // [out, r]
  return mul(matmul(b, a), scale_);                                        // [out, in]
}

void LoRALinear::merge() {
  MT_CHECK(!merged_, "LoRALinear::merge: '", path_, "' is already merged; merging again would add its update twice");
  check_mergeable("LoRALinear::merge");
  NoGradGuard no_grad;
  const Tensor d = delta();
  weight.copy_(add(weight.detach().to(d.dtype()), d));  // one rounding into W's dtype
  merged_ = true;
}

void LoRALinear::unmerge() {
  MT_CHECK(merged_, "LoRALinear::unmerge: '", path_, "' is not merged");
  check_mergeable("LoRALinear::unmerge");
  NoGradGuard no_grad;
  const Tensor d = delta();
  weight.copy_(sub(weight.detach().to(d.dtype()), d));
  merged_ = false;
}

void LoRALinear::check_mergeable(const char* who) const {
  MT_CHECK(!has_fp8_weight(), who, ": '", path_,
           "' has an FP8 base (its weight is E4M3 rows with per-channel scales, from quantize_linears_fp8), and "
           "the update added there would be rounded to FP8 with it; save the adapter (save_adapter) and merge it into "
           "the high-precision base instead (mt_merge, or merge_lora on the model loaded without an FP8 base)");
}

// ---- model-level functions ----

std::vector<std::pair<std::string, std::shared_ptr<LoRALinear>>> lora_layers(const Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<LoRALinear>>> out;
  for (const auto& [path, m] : model.named_modules()) {
    if (auto layer = std::dynamic_pointer_cast<LoRALinear>(m)) out.emplace_back(path, layer);
  }
  return out;
}

std::vector<std::string> apply_lora(Module& model, const LoRAOptions& options, Generator* generator) {
  const std::vector<Target> plan = plan_lora(model, options);
  carry_out(model, plan, options, generator);
  std::vector<std::string> paths;
  for (const Target& t : plan) paths.push_back(t.path);
  return paths;
}

void merge_lora(Module& model) {
  const auto layers = lora_layers(model);
  MT_CHECK(!layers.empty(), "merge_lora: the model has no LoRA layers");
  for (const auto& [path, layer] : layers) {
    MT_CHECK(!layer->merged(), "merge_lora: '", path, "' is already merged; no layer was changed");
    layer->check_mergeable("merge_lora");
  }
  for (const auto& [path, layer] : layers) layer->merge();
}

void unmerge_lora(Module& model) {
  const auto layers = lora_layers(model);
  MT_CHECK(!layers.empty(), "unmerge_lora: the model has no LoRA layers");
  for (const auto& [path, layer] : layers)
    MT_CHECK(layer->merged(), "unmerge_lora: '", path, "' is not merged; no layer was changed");
  for (const auto& [path, layer] : layers) layer->unmerge();
}

void merge_and_unload(Module& model) {
  const auto layers = lora_layers(model);
  MT_CHECK(!layers.empty(), "merge_and_unload: the model has no LoRA layers");
  for (const auto& [path, layer] : layers) layer->check_mergeable("merge_and_unload");
  std::map<std::string, Module*> by_path;
  for (const auto& [path, m] : model.named_modules()) by_path[path] = m.get();
  for (const auto& [path, layer] : layers) {
    if (!layer->merged()) layer->merge();
    auto plain = std::make_shared<Linear>(layer->weight, layer->bias);
    plain->requires_grad_(layer->weight.requires_grad());  // frozen stays frozen, as in PEFT
    const size_t dot = path.rfind('.');
    Module* parent = dot == std::string::npos ? &model : by_path.at(path.substr(0, dot));
    parent->replace_module(dot == std::string::npos ? path : path.substr(dot + 1), plain);
  }
}

std::string trainable_parameters_summary(const Module& model) {
  const int64_t all = model.num_parameters();
  const int64_t trainable = model.num_parameters(/*trainable_only=*/true);
  MT_CHECK(all > 0, "trainable_parameters_summary: the model has no parameters");
  char percent[32];
  std::snprintf(percent, sizeof(percent), "%.4f", 100.0 * static_cast<double>(trainable) / static_cast<double>(all));
  return "trainable params: " + with_commas(trainable) + " || all params: " + with_commas(all) +
         " || trainable%: " + percent;
}

void save_adapter(const Module& model, const std::string& dir, const AdapterSaveOptions& options) {
  const auto layers = lora_layers(model);
  MT_CHECK(!layers.empty(), "save_adapter: the model has no LoRA layers (apply_lora first)");
  const auto& [first_path, first] = layers.front();
  std::map<std::string, Tensor> tensors;
  for (const auto& [path, layer] : layers) {
    MT_CHECK(!layer->merged(), "save_adapter: '", path,
             "' is merged: its update is already inside the base weight, and loading the adapter onto that "
             "weight would count it twice; unmerge_lora first");
    MT_CHECK(same_config(layer->options(), first->options()), "save_adapter: '", path, "' has ",
             describe_config(layer->options()), " but '", first_path, "' has ", describe_config(first->options()),
             "; one adapter file holds one configuration");
    tensors[kKeyPrefix + path + ".lora_A.weight"] = layer->lora_A->weight.detach();
    tensors[kKeyPrefix + path + ".lora_B.weight"] = layer->lora_B->weight.detach();
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK_T(FileError, !ec, "save_adapter: ", dir, ": cannot create the directory: ", ec.message());
  save_safetensors((fs::path(dir) / kWeightsFile).string(), tensors, {{"format", "pt"}});
  // PEFT writes json.dumps(config, indent=2, sort_keys=True); nlohmann's object keeps keys sorted.
  write_file_atomically((fs::path(dir) / kConfigFile).string(), "adapter config",
                        config_json(first->options(), options).dump(2));
}

void load_adapter(Module& model, const std::string& dir, Generator* generator) {
  std::error_code ec;
  MT_CHECK_T(FileError, fs::is_directory(dir, ec), "load_adapter: ", dir, ": not a directory (",
             ec ? ec.message() : std::string("no such directory"), ")");
  const std::string config_path = (fs::path(dir) / kConfigFile).string();
  const std::string weights_path = (fs::path(dir) / kWeightsFile).string();
  const LoRAOptions options = read_adapter_config(config_path);

  // Work out which layers the file must fill, changing nothing yet.
  std::vector<Target> plan;
  std::vector<AdapterSlot> slots;
  if (lora_layers(model).empty()) {
    try {
      plan = plan_lora(model, options);
    } catch (const Error& e) {
      fail_adapter_file(config_path, e.what());
    }
    for (const Target& t : plan) slots.push_back(AdapterSlot{t.path, t.base->weight.size(0), t.base->weight.size(1)});
  } else {
    slots = existing_slots(model, options, config_path);
  }
  SafetensorsFile file;
  try {
    file = load_safetensors(weights_path);
  } catch (const FileError& e) {
    throw FileError(std::string("load_adapter: ") + e.what());
  }
  check_adapter_tensors(file.tensors, slots, options.r, weights_path);

  if (!plan.empty()) {
    try {
      carry_out(model, plan, options, generator);  // restores the model itself when it fails
    } catch (const Error& e) {
      fail_adapter_file(config_path, e.what());
    }
  }
  NoGradGuard no_grad;
  for (const auto& [path, layer] : lora_layers(model)) {
    layer->lora_A->weight.copy_(file.tensors.at(kKeyPrefix + path + ".lora_A.weight"));
    layer->lora_B->weight.copy_(file.tensors.at(kKeyPrefix + path + ".lora_B.weight"));
  }
}

}  // namespace mt::nn
