// Modules: named parameters, buffers and children, as torch.nn.Module.
//
//   class Block : public mt::nn::Module {
//    public:
//     Block() { register_module("fc", fc, std::make_shared<mt::nn::Linear>(mt::nn::LinearOptions(64, 64))); }
//     mt::Tensor forward(const mt::Tensor& x) { return fc->forward(x); }
//     std::shared_ptr<mt::nn::Linear> fc;
//   };
//
// Names are dotted paths ("blocks.0.attn.weight"), in registration order.
// A child registered together with its member slot (as above) can later be
// swapped by replace_module(), which also re-points the member: this is how
// apply_lora() puts a LoRALinear where a Linear was.
// to(device) / to(dtype) change a parameter's data in place (Tensor handles held
// by the module's members stay valid, requires_grad is kept). state_dict() is the
// name -> tensor map that save()/load() write as safetensors.
//
// Tracing: each module's forward opens `const auto scope = trace_scope();` first thing. While NVTX
// ranges are on (core/nvtx.h: MT_NVTX=1, a host trace) that is a range named by trace_name(); while
// an OpProfiler is active it is the module scope that OpProfiler::module_rows() charges to. Off,
// it reads two flags and does nothing else. trace_name() is the module's dotted path once
// name_modules_for_tracing() has named the tree ("gpt", "gpt.transformer.h.0.attn"), else its
// type's name ("Linear").
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/profiler.h"
#include "core/error.h"
#include "core/nvtx.h"
#include "core/tensor.h"

namespace mt::nn {

class Module;

// The scope a module's forward opens (Module::trace_scope). Not copyable or movable: it is made
// where it is used and closes at the end of that block.
class TraceScope {
 public:
  explicit TraceScope(const Module& module) {
    if (nvtx::enabled() || OpProfiler::active()) open(module);
  }
  ~TraceScope() {
    if (opened_) close();
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  void open(const Module& module);
  void close();
  std::optional<nvtx::Range> range_;
  bool profiled_ = false;  // pushed a module scope for the profiler
  bool opened_ = false;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- traversal (recursive, registration order, dotted names) ----
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<Tensor> trainable_parameters() const;  // those that require grad
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Every module below this one (not itself), depth first, with its dotted path.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  int64_t num_parameters(bool trainable_only = false) const;

  // ---- mode, placement, freezing ----
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void to(Device device);
  // Floating parameters and buffers only (f64, f32, f16, bf16), except buffers registered with
  // BufferDType::fixed. FP8 tensors keep their format: their values mean something only with the
  // scales stored beside them (Note [FP8 frozen base], ops/fp8/fp8_rowwise.h).
  void to(DType dtype);
  void requires_grad_(bool requires_grad);
  void freeze() { requires_grad_(false); }

  // ---- state ----
  std::map<std::string, Tensor> state_dict() const;  // parameters and buffers, detached
  // Copies values into the existing tensors (their dtype and device stay). With
  // strict, missing and unexpected names are errors; shapes must always match, and an FP8
  // tensor loads only from an FP8 one (and the reverse): a conversion would drop its scales.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  void save(const std::string& path) const;  // safetensors, written atomically
  void load(const std::string& path, bool strict = true);

  // ---- surgery ----
  // Puts `module` in place of the direct child `name`. The child must have been
  // registered with a member slot, and `module` must fit that slot's type.
  void replace_module(const std::string& name, std::shared_ptr<Module> module);

  // ---- tracing ----
  // Ranges and profiler rows carry this name: the one set_trace_name() or
  // name_modules_for_tracing() gave, else the type's name without its namespace ("Linear").
  const std::string& trace_name() const;
  void set_trace_name(std::string name);
  TraceScope trace_scope() const { return TraceScope(*this); }

 protected:
  // What to(DType) does with a buffer: convert it with the parameters, or keep its dtype (the f32
  // scales of an FP8 weight, which the FP8 GEMMs read as f32 whatever the model's dtype).
  enum class BufferDType { follows_module, fixed };

  const Tensor& register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  const Tensor& register_buffer(const std::string& name, Tensor tensor,
                                BufferDType dtype_rule = BufferDType::follows_module);
  // Points the handle t (one of this module's parameters or buffers) at src's data: storage, shape,
  // strides and dtype. Its identity and autograd state stay, so every member and list holding the
  // handle sees the new data (to(), and a weight replaced by its FP8 form).
  static void set_tensor_data(const Tensor& t, const Tensor& src);
  // A child without a member slot (containers, or members never replaced).
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module, nullptr);
    return module;
  }
  // A child stored in the member `slot`, which replace_module() keeps pointing at it.
  template <typename M>
  void register_module(const std::string& name, std::shared_ptr<M>& slot, std::shared_ptr<M> module) {
    slot = module;
    add_child(name, module, [&slot, name](const std::shared_ptr<Module>& replacement) {
      auto typed = std::dynamic_pointer_cast<M>(replacement);
      MT_CHECK(typed, "Module::replace_module: the replacement for '", name,
               "' does not derive from the type of the member it must fill");
      slot = typed;
    });
  }

 private:
  struct Child {
    std::string name;
    std::shared_ptr<Module> module;
    std::function<void(const std::shared_ptr<Module>&)> rebind;  // re-points the owner's member; may be empty
  };
  void add_child(const std::string& name, std::shared_ptr<Module> module,
                 std::function<void(const std::shared_ptr<Module>&)> rebind);
  void check_new_name(const std::string& name) const;
  template <typename Visit>
  void visit_tensors(const std::string& prefix, bool parameters, Visit&& visit) const;
  void convert_to(DType dtype);  // to(DType) below the checks, recursively

  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::string> fixed_dtype_buffers_;  // registered with BufferDType::fixed
  std::vector<Child> children_;
  bool training_ = true;
  // Filled on first use with the type's name unless a name was set: the dynamic type is only
  // known once the derived constructor has run.
  mutable std::string trace_name_;
  mutable std::once_flag trace_name_once_;
};

// Names `root` and every module below it for tracing by their dotted paths under `root_name`:
// name_modules_for_tracing(model, "gpt") names the model "gpt" and its modules "gpt.transformer",
// "gpt.transformer.h.0", "gpt.transformer.h.0.attn.c_attn", ... (named_modules() order). A module
// reached by two paths keeps the first. Call it again after swapping modules (apply_lora).
void name_modules_for_tracing(Module& root, const std::string& root_name);

// An ordered list of children named "0", "1", ... (torch.nn.ModuleList), for
// paths such as "h.3.attn.c_attn" that match Hugging Face's.
class ModuleList : public Module {
 public:
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    return register_module(std::to_string(size_++), std::move(module));
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

}  // namespace mt::nn
