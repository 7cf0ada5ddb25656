#include "ops/nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <typeinfo>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "core/safetensors.h"
#include "core/view.h"

namespace mt::nn {

namespace {

// Replaces t's data with src's (storage, shape, strides, dtype), keeping t's
// identity and autograd state: members holding the handle see the new data.
void set_data(const Tensor& t, const Tensor& src) {
  TensorImpl* impl = t.impl();
  impl->storage = src.storage();
  impl->shape = src.shape();
  impl->strides = src.strides();
  impl->offset = src.offset();
  impl->dtype = src.dtype();
  t.bump_version();
}

// The type's name without its namespaces: "mt::nn::Linear" -> "Linear".
std::string type_name(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : type.name();
  std::free(demangled);
  const size_t colons = name.rfind("::", name.find('<'));
  return colons == std::string::npos ? name : name.substr(colons + 2);
}

}  // namespace

void TraceScope::open(const Module& module) {
  opened_ = true;
  const std::string& name = module.trace_name();
  if (nvtx::enabled()) range_.emplace(name);
  if (OpProfiler::active()) {
    OpProfiler::push_module(name);
    profiled_ = true;
  }
}

void TraceScope::close() {
  if (profiled_) OpProfiler::pop_module();
  range_.reset();
}

const std::string& Module::trace_name() const {
  std::call_once(trace_name_once_, [this] {
    if (trace_name_.empty()) trace_name_ = type_name(typeid(*this));
  });
  return trace_name_;
}

void Module::set_trace_name(std::string name) {
  MT_CHECK(!name.empty(), "Module::set_trace_name: the name is empty");
  trace_name_ = std::move(name);
}

void name_modules_for_tracing(Module& root, const std::string& root_name) {
  root.set_trace_name(root_name);
  std::unordered_set<const Module*> named{&root};
  for (const auto& [path, module] : root.named_modules()) {
    if (named.insert(module.get()).second) module->set_trace_name(root_name + "." + path);
  }
}

void Module::check_new_name(const std::string& name) const {
  MT_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module: invalid name '", name,
           "' (names must be non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    for (const auto& entry : list) {
      if (entry.first == name) return true;
    }
    return false;
  };
  bool child_taken = false;
  for (const Child& child : children_) child_taken = child_taken || child.name == name;
  MT_CHECK(!taken(parameters_) && !taken(buffers_) && !child_taken, "Module: the name '", name,
           "' is already registered");
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module,
                       std::function<void(const std::shared_ptr<Module>&)> rebind) {
  check_new_name(name);
  MT_CHECK(module != nullptr, "Module::register_module: '", name, "' is a null module");
  children_.push_back(Child{name, std::move(module), std::move(rebind)});
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const Child& child : children_) out.emplace_back(child.name, child.module);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const Child& child : children_) {
    out.emplace_back(child.name, child.module);
    for (auto& [path, below] : child.module->named_modules()) out.emplace_back(child.name + "." + path, below);
  }
  return out;
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  MT_CHECK(module != nullptr, "Module::replace_module: the replacement for '", name, "' is null");
  for (Child& child : children_) {
    if (child.name != name) continue;
    MT_CHECK(child.rebind, "Module::replace_module: '", name,
             "' was registered without a member slot, so its owner would keep using the old module");
    child.rebind(module);  // checks the type before anything changes
    child.module = std::move(module);
    return;
  }
  throw Error(detail::str_cat("Module::replace_module: no child named '", name, "'"));
}

const Tensor& Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name);
  MT_CHECK(tensor.defined(), "Module::register_parameter: '", name, "' is an undefined tensor");
  tensor = tensor.detach();  // a parameter is a leaf
  if (requires_grad) tensor.requires_grad_(true);
  parameters_.emplace_back(name, tensor);
  return parameters_.back().second;
}

const Tensor& Module::register_buffer(const std::string& name, Tensor tensor, BufferDType dtype_rule) {
  check_new_name(name);
  MT_CHECK(tensor.defined(), "Module::register_buffer: '", name, "' is an undefined tensor");
  buffers_.emplace_back(name, tensor.detach());
  if (dtype_rule == BufferDType::fixed) fixed_dtype_buffers_.push_back(name);
  return buffers_.back().second;
}

void Module::set_tensor_data(const Tensor& t, const Tensor& src) { set_data(t, src); }

template <typename Visit>
void Module::visit_tensors(const std::string& prefix, bool parameters, Visit&& visit) const {
  for (const auto& [name, t] : parameters ? parameters_ : buffers_) visit(prefix + name, t);
  for (const Child& child : children_) child.module->visit_tensors(prefix + child.name + ".", parameters, visit);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit_tensors("", true, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::trainable_parameters() const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : named_parameters()) {
    if (t.requires_grad()) out.push_back(t);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit_tensors("", false, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) {
    if (!trainable_only || t.requires_grad()) n += t.numel();
  }
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (Child& child : children_) child.module->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  auto move = [&](const std::string&, const Tensor& t) {
    if (t.device() != device) set_data(t, raw::to(t, device));
  };
  visit_tensors("", true, move);
  visit_tensors("", false, move);
}

void Module::to(DType dtype) {
  MT_CHECK_T(DTypeError, is_floating(dtype), "Module::to: ", dtype_name(dtype), " is not a floating dtype");
  NoGradGuard no_grad;
  convert_to(dtype);
}

void Module::convert_to(DType dtype) {
  auto cast = [&](const Tensor& t) {
    if (is_compute_floating(t.dtype()) && t.dtype() != dtype) set_data(t, raw::to(t, dtype));
  };
  for (const auto& [name, t] : parameters_) cast(t);
  for (const auto& [name, t] : buffers_) {
    if (std::find(fixed_dtype_buffers_.begin(), fixed_dtype_buffers_.end(), name) == fixed_dtype_buffers_.end()) {
      cast(t);
    }
  }
  for (Child& child : children_) child.module->convert_to(dtype);
}

void Module::requires_grad_(bool requires_grad) {
  for (const auto& [name, t] : named_parameters()) {
    Tensor handle = t;
    handle.requires_grad_(requires_grad);
    if (!requires_grad) handle.set_grad(Tensor());  // a frozen parameter keeps no gradient buffer
  }
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : named_parameters()) out[name] = t.detach();
  for (const auto& [name, t] : named_buffers()) out[name] = t.detach();
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  const std::map<std::string, Tensor> mine = state_dict();
  // The first names of each list, then a count: a checkpoint of another model can miss every key.
  constexpr int kNamesShown = 8;
  std::string missing, unexpected;
  int n_missing = 0, n_unexpected = 0;
  for (const auto& [name, t] : mine) {
    if (!state.count(name) && ++n_missing <= kNamesShown) missing += " " + name;
  }
  for (const auto& [name, t] : state) {
    if (!mine.count(name) && ++n_unexpected <= kNamesShown) unexpected += " " + name;
  }
  if (n_missing > kNamesShown) missing += " ... (" + std::to_string(n_missing - kNamesShown) + " more)";
  if (n_unexpected > kNamesShown) unexpected += " ... (" + std::to_string(n_unexpected - kNamesShown) + " more)";
  MT_CHECK(!strict || (missing.empty() && unexpected.empty()),
           "load_state_dict: ", missing.empty() ? "" : "missing keys:" + missing,
           missing.empty() || unexpected.empty() ? "" : "; ",
           unexpected.empty() ? "" : "unexpected keys:" + unexpected);
  // Every tensor is checked before any is copied, so a refused state leaves the module as it was.
  for (const auto& [name, target] : mine) {
    auto it = state.find(name);
    if (it == state.end()) continue;
    MT_CHECK_T(ShapeError, it->second.shape() == target.shape(), "load_state_dict: '", name, "' has shape ",
               shape_str(it->second.shape()), " in the state but ", shape_str(target.shape()), " in the module");
    check_loadable("load_state_dict", name, it->second.dtype(), target.dtype());
    const auto fp8 = [](DType d) { return d == DType::f8e4m3 || d == DType::f8e5m2; };
    const bool either_fp8 = fp8(it->second.dtype()) || fp8(target.dtype());
    MT_CHECK_T(DTypeError, !either_fp8 || it->second.dtype() == target.dtype(), "load_state_dict: '", name, "' is ",
               dtype_name(it->second.dtype()), " in the state but ", dtype_name(target.dtype()),
               " in the module; an FP8 tensor stands for its values only with the scales stored beside it, so it "
               "loads only from an FP8 tensor of its own format (a high-precision checkpoint loads before "
               "nn::quantize_linears_fp8 casts the weights)");
  }
  NoGradGuard no_grad;
  for (const auto& [name, target] : mine) {
    auto it = state.find(name);
    if (it != state.end()) target.copy_(it->second);
  }
}

void Module::save(const std::string& path) const { save_safetensors(path, state_dict()); }

void Module::load(const std::string& path, bool strict) {
  try {
    load_state_dict(load_safetensors(path).tensors, strict);
  } catch (const FileError&) {
    throw;
  } catch (const Error& e) {
    throw FileError(path + ": " + e.what());
  }
}

}  // namespace mt::nn
