#include "autograd/autocast.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace mt {

namespace {

struct DeviceTypeState {
  bool enabled = false;
  DType dtype = DType::bf16;
};

struct CacheEntry {
  std::weak_ptr<TensorImpl> source;  // identity check: a freed and reused address is not a hit
  std::weak_ptr<Storage> storage;    // the source's storage: Module::to() swaps it in place (set_data)
  uint64_t version = 0;
  Tensor cast;
  bool kept = false;               // a frozen leaf's unrecorded copy: outlives the region (Note [Autocast cast cache])
  bool provided = false;           // an optimizer's copy (Note [Provided copies]): outlives the region too
  const void* provider = nullptr;  // who provided it (ServeCopiesInCapture names whom a capture serves)
};

struct AutocastState {
  DeviceTypeState per_type[2];
  int depth = 0;
  const autocast::ServeCopiesInCapture* serving = nullptr;  // the innermost one open
  uint64_t casts = 0;
  // Note [Autocast cast cache]; keyed also by whether the cast was recorded (a Cast node) or not.
  std::map<std::tuple<const TensorImpl*, DType, bool>, CacheEntry> cache;
};

thread_local AutocastState t_state;

// Whether `e` still describes t as it is now: the same tensor, storage and version.
bool still_valid(const CacheEntry& e, const Tensor& t) {
  return e.source.lock().get() == t.impl() && e.storage.lock() == t.storage() && e.version == t.version();
}

// Drops every entry but the kept and provided copies whose tensor lives on unchanged (entering
// and leaving the outermost region, so that a freed model's copies do not wait for the next
// region's end).
void prune_cache() {
  for (auto it = t_state.cache.begin(); it != t_state.cache.end();) {
    const CacheEntry& e = it->second;
    const std::shared_ptr<TensorImpl> source = e.source.lock();
    const std::shared_ptr<Storage> storage = e.storage.lock();
    const bool keep = (e.kept || e.provided) && source != nullptr && storage != nullptr && source->storage == storage &&
                      storage->version() == e.version;
    it = keep ? std::next(it) : t_state.cache.erase(it);
  }
}

DeviceTypeState& for_type(DeviceType t) { return t_state.per_type[static_cast<int>(t)]; }

// t in `target`; recorded (a Cast node, whose backward casts the gradient back) or not (a plain
// copy, for an op that records t itself and writes its gradient in t's dtype).
Tensor cast_to(const Tensor& t, DType target, bool recorded) {
  if (t.dtype() == target) return t;
  // Unrecorded copies of frozen leaves are kept across regions (operand_copies: parameters);
  // not while a CUDA Graph is captured, whose replays must cast the weight as it is then.
  const bool kept = !recorded && t.dtype() == DType::f32 && !t.requires_grad() && t.is_leaf() && !cuda::capturing();
  const bool cacheable = kept || (t.dtype() == DType::f32 && t.requires_grad() && t.is_leaf());
  const auto key = std::make_tuple(static_cast<const TensorImpl*>(t.impl()), target, recorded);
  if (cacheable) {
    auto it = t_state.cache.find(key);
    // A kept copy serves only while its tensor is still frozen; a cached trainable one only
    // while the tensor still requires grad; a provided one inside a CUDA Graph capture only
    // where the capturer keeps it current between replays (Note [Provided copies]).
    if (it != t_state.cache.end() && still_valid(it->second, t) && it->second.kept == kept &&
        !(it->second.provided && cuda::capturing() && !autocast::serves_in_capture(it->second.provider))) {
      return it->second.cast;
    }
  }
  Tensor cast;
  if (recorded) {
    cast = t.to(target);
  } else {
    NoGradGuard untracked;
    cast = t.to(target);
  }
  ++t_state.casts;
  if (cacheable) t_state.cache[key] = CacheEntry{t.impl_ptr(), t.storage(), t.version(), cast, kept};
  return cast;
}

}  // namespace

AutocastGuard::AutocastGuard(DeviceType device_type, DType dtype, bool enabled)
    : device_type_(device_type),
      previous_enabled_(for_type(device_type).enabled),
      previous_dtype_(for_type(device_type).dtype) {
  MT_CHECK_T(DTypeError, is_half(dtype), "AutocastGuard: the low-precision dtype must be f16 or bf16, got ",
             dtype_name(dtype));
  for_type(device_type).enabled = enabled;
  for_type(device_type).dtype = dtype;
  if (t_state.depth++ == 0) prune_cache();
}

AutocastGuard::~AutocastGuard() {
  for_type(device_type_).enabled = previous_enabled_;
  for_type(device_type_).dtype = previous_dtype_;
  if (--t_state.depth == 0) prune_cache();
}

namespace autocast {

bool is_enabled(DeviceType device_type) { return for_type(device_type).enabled; }
DType dtype(DeviceType device_type) { return for_type(device_type).dtype; }
uint64_t cast_count() { return t_state.casts; }

namespace {

std::vector<Tensor> apply_policy(const char* op, std::vector<Tensor> inputs, bool recorded) {
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs) {
    if (t.defined() && is_floating(t.dtype())) {
      first = &t;
      break;
    }
  }
  if (first == nullptr || !is_enabled(first->device().type)) return inputs;
  const DeviceType type = first->device().type;
  switch (policy_for(op)) {
    case CastPolicy::lower_precision:
      for (Tensor& t : inputs) {
        if (t.defined() && t.dtype() == DType::f32 && t.device().type == type) t = cast_to(t, dtype(type), recorded);
      }
      break;
    case CastPolicy::fp32:
      for (Tensor& t : inputs) {
        if (t.defined() && is_half(t.dtype())) t = cast_to(t, DType::f32, recorded);
      }
      break;
    case CastPolicy::promote: {
      DType widest = first->dtype();
      for (const Tensor& t : inputs) {
        if (t.defined() && is_floating(t.dtype())) widest = promote_types(widest, t.dtype());
      }
      for (Tensor& t : inputs) {
        if (t.defined() && (is_half(t.dtype()) || t.dtype() == DType::f32)) t = cast_to(t, widest, recorded);
      }
      break;
    }
    case CastPolicy::none:
      break;
  }
  return inputs;
}

}  // namespace

std::vector<Tensor> cast_inputs(const char* op, std::vector<Tensor> inputs) {
  return apply_policy(op, std::move(inputs), /*recorded=*/true);
}

std::vector<Tensor> operand_copies(const char* op, std::vector<Tensor> inputs) {
  return apply_policy(op, std::move(inputs), /*recorded=*/false);
}

Tensor cast_input(const char* op, const Tensor& input) { return cast_inputs(op, {input})[0]; }

void provide_copy(const Tensor& source, const Tensor& copy, const void* provider) {
  MT_CHECK(source.dtype() == DType::f32 && source.is_leaf() && is_half(copy.dtype()) &&
               copy.shape() == source.shape() && copy.device() == source.device(),
           "autocast::provide_copy: a ", dtype_name(copy.dtype()), " copy ", shape_str(copy.shape()), " on ",
           copy.device().str(), " of a ", source.is_leaf() ? "leaf " : "non-leaf ", dtype_name(source.dtype()),
           " tensor ", shape_str(source.shape()), " on ", source.device().str(),
           " (wanted: an f16 or bf16 copy of an f32 leaf, of its shape and on its device)");
  const auto key = std::make_tuple(static_cast<const TensorImpl*>(source.impl()), copy.dtype(), /*recorded=*/false);
  t_state.cache[key] = CacheEntry{source.impl_ptr(), source.storage(), source.version(), copy, /*kept=*/false,
                                  /*provided=*/true, provider};
}

ServeCopiesInCapture::ServeCopiesInCapture(std::vector<const void*> providers)
    : providers_(std::move(providers)), outer_(t_state.serving) {
  t_state.serving = this;
}
ServeCopiesInCapture::~ServeCopiesInCapture() { t_state.serving = outer_; }

bool serves_in_capture(const void* provider) {
  const ServeCopiesInCapture* serving = t_state.serving;
  return provider != nullptr && cuda::capturing() && serving != nullptr &&
         std::find(serving->providers_.begin(), serving->providers_.end(), provider) != serving->providers_.end();
}

void withdraw_copy(const Tensor& source, DType dtype) {
  const auto it = t_state.cache.find(std::make_tuple(static_cast<const TensorImpl*>(source.impl()), dtype, false));
  if (it != t_state.cache.end() && it->second.provided) t_state.cache.erase(it);
}

}  // namespace autocast
}  // namespace mt
