// Tensor: a handle to (storage, shape, strides, offset, dtype). Copying a
// Tensor copies the handle, not the data.
//
// Layout: row-major by default, the last dimension fastest. Strides and offset
// count elements, not bytes. A view shares its base's storage (and version
// counter); writes through either are visible in both.
//
// Layering: core/ knows nothing of autograd. A tensor carries an opaque
// `autograd_meta` pointer that autograd/ fills in; the methods below marked
// [autograd] are declared here for a PyTorch-like API and implemented in
// autograd/ and ops/, which is where gradients are recorded. The functions in
// namespace mt::raw (core/view.h) are the non-recording primitives they use.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

namespace mt {

namespace autograd {
struct AutogradMeta;  // defined in autograd/; opaque to core
class Node;
}  // namespace autograd

using Shape = std::vector<int64_t>;
constexpr int kMaxDims = 8;  // the most dimensions a tensor may have (kernel argument size)

std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::shared_ptr<autograd::AutogradMeta> autograd_meta;  // null outside autograd
};

// What a factory makes: dtype, device, requires_grad.
// mt::zeros({2, 3}, mt::TensorOptions().dtype(DType::bf16).device("cuda"))
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType d) : dtype_(d) {}         // NOLINT: zeros({2}, DType::f16)
  TensorOptions(Device d) : device_(d) {}       // NOLINT: zeros({2}, Device("cuda"))
  TensorOptions(const char* d) : device_(d) {}  // NOLINT: zeros({2}, "cuda")
  TensorOptions dtype(DType d) const {
    auto o = *this;
    o.dtype_ = d;
    return o;
  }
  TensorOptions device(Device d) const {
    auto o = *this;
    o.device_ = d;
    return o;
  }
  TensorOptions requires_grad(bool r) const {
    auto o = *this;
    o.requires_grad_ = r;
    return o;
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }

 private:
  DType dtype_ = DType::f32;
  Device device_ = kCPU;
  bool requires_grad_ = false;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  long impl_use_count() const { return impl_.use_count(); }  // handles sharing this impl

  // ---- metadata ----
  const Shape& shape() const { return checked()->shape; }
  const Shape& strides() const { return checked()->strides; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(shape()); }
  int64_t offset() const { return checked()->offset; }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->storage->device(); }
  bool is_cuda() const { return device().is_cuda(); }
  size_t element_size() const { return mt::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return checked()->storage; }
  bool shares_storage_with(const Tensor& other) const { return storage() == other.storage(); }

  // Pointer to the first element of this view.
  void* data_ptr() const;
  template <typename T>
  T* data() const;  // checks that T matches dtype()

  // ---- data movement (no autograd) ----
  // Copies src into this tensor's elements (any dtype / device; shapes must match
  // or src must broadcast to this shape). Bumps the version.
  // In-place methods are const, as in PyTorch: a Tensor is a handle, and writing
  // through a const handle changes the data it refers to, not the handle.
  const Tensor& copy_(const Tensor& src) const;
  const Tensor& fill_(double value) const;
  const Tensor& zero_() const { return fill_(0.0); }
  double item() const;  // one-element tensor -> double (waits for the device)
  template <typename T>
  std::vector<T> to_vector() const;  // contiguous copy on the host, converted to T
  std::string str() const;           // readable printing, summarised when large

  // ---- [autograd] implemented in ops/: differentiable views and conversions ----
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous() const;
  Tensor clone() const;

  // ---- [autograd] implemented in autograd/ ----
  // Conversions: the result is recorded (its gradient converted back) when this requires grad.
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);
  bool is_leaf() const;
  Tensor grad() const;  // undefined until backward reached this leaf
  void set_grad(const Tensor& grad);
  std::shared_ptr<autograd::Node> grad_fn() const;
  Tensor detach() const;  // shares data, no history
  // Back-propagates from this tensor. A non-scalar tensor needs `gradient`.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Runs when this tensor's gradient is computed; may return a replacement
  // (an undefined return keeps the gradient as it is).
  void register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // Leaves only: runs after the gradient has been accumulated into grad().
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;

  // Shared-data bookkeeping.
  uint64_t version() const { return storage()->version(); }
  void bump_version() const { storage()->bump_version(); }

 private:
  TensorImpl* checked() const {
    MT_CHECK(impl_ != nullptr, "Tensor: operation on an undefined tensor");
    return impl_.get();
  }
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& t);

namespace detail {
// The opaque hook through which autograd/ (loaded with the library) marks a
// freshly made tensor as requiring grad, so factories can honour
// TensorOptions::requires_grad without core/ depending on autograd/.
using RequiresGradHook = void (*)(Tensor&);
void set_requires_grad_hook(RequiresGradHook hook);
RequiresGradHook requires_grad_hook();
Tensor apply_requires_grad(Tensor t, const TensorOptions& options);  // factories call this last
}  // namespace detail

// ---- factories ----
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {});
Tensor arange(int64_t end, TensorOptions options = {});
// From host values (copied; converted to options.dtype()).
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions options = {});
Tensor from_blob(const void* data, const Shape& shape, DType dtype, TensorOptions options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

}  // namespace mt
