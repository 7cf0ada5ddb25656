#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/view.h"

namespace mt {

namespace detail {
namespace {
RequiresGradHook g_requires_grad_hook = nullptr;
}
void set_requires_grad_hook(RequiresGradHook hook) { g_requires_grad_hook = hook; }
RequiresGradHook requires_grad_hook() { return g_requires_grad_hook; }
Tensor apply_requires_grad(Tensor t, const TensorOptions& options) {
  if (options.requires_grad()) {
    MT_CHECK(g_requires_grad_hook != nullptr,
             "TensorOptions::requires_grad: autograd is not linked (link mixtrain::mixtrain)");
    g_requires_grad_hook(t);
  }
  return t;
}
}  // namespace detail

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t Tensor::size(int64_t d) const { return shape()[raw::wrap_dim(d, dim(), "Tensor::size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[raw::wrap_dim(d, dim(), "Tensor::stride")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape().size(); i-- > 0;) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  auto* base = static_cast<char*>(storage()->data());
  return base ? base + offset() * static_cast<int64_t>(element_size()) : nullptr;
}

template <typename T>
T* Tensor::data() const {
  MT_CHECK_T(DTypeError, dtype_of<T>() == dtype(), "Tensor::data: tensor has dtype ", dtype_name(dtype()), " but ",
             dtype_name(dtype_of<T>()), " was asked for");
  return static_cast<T*>(data_ptr());
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  MT_CHECK(src.defined(), "copy_: source tensor is undefined");
  const Tensor expanded = raw::expand(src, shape());
  if (device() == src.device()) {
    if (device().is_cpu()) {
      kernels::copy_cpu(*this, expanded);
    } else {
      kernels::copy_cuda(*this, expanded);
    }
  } else {
    // Across devices: make the source contiguous in the destination's dtype on its
    // own device, move the bytes, then scatter into this view on its device.
    const Tensor packed = raw::to(raw::contiguous(expanded), dtype());
    if (is_contiguous()) {
      const auto kind = is_cuda() ? cuda::CopyKind::host_to_device : cuda::CopyKind::device_to_host;
      cuda::copy_bytes(data_ptr(), packed.data_ptr(), nbytes(), kind, is_cuda() ? device().index : src.device().index);
    } else {
      Tensor staged = empty(shape(), TensorOptions().dtype(dtype()).device(device()));
      staged.copy_(packed);
      copy_(staged);
      return *this;
    }
  }
  bump_version();
  return *this;
}

const Tensor& Tensor::fill_(double value) const {
  if (is_cuda()) {
    kernels::fill_cuda(*this, value);
  } else {
    kernels::fill_cpu(*this, value);
  }
  bump_version();
  return *this;
}

double Tensor::item() const {
  MT_CHECK(numel() == 1, "item: tensor has ", numel(), " elements (shape ", shape_str(shape()),
           "); item() needs exactly one");
  const Tensor host = raw::to(*this, kCPU, DType::f64);
  return *host.data<double>();
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = raw::contiguous(raw::to(*this, kCPU, dtype_of<T>()));
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

#define MT_INSTANTIATE_TENSOR_ACCESSORS(T) \
  template T* Tensor::data<T>() const;     \
  template std::vector<T> Tensor::to_vector<T>() const;
MT_INSTANTIATE_TENSOR_ACCESSORS(double)
MT_INSTANTIATE_TENSOR_ACCESSORS(float)
MT_INSTANTIATE_TENSOR_ACCESSORS(Half)
MT_INSTANTIATE_TENSOR_ACCESSORS(BFloat16)
MT_INSTANTIATE_TENSOR_ACCESSORS(Float8E4M3)
MT_INSTANTIATE_TENSOR_ACCESSORS(Float8E5M2)
MT_INSTANTIATE_TENSOR_ACCESSORS(int64_t)
MT_INSTANTIATE_TENSOR_ACCESSORS(int32_t)
MT_INSTANTIATE_TENSOR_ACCESSORS(uint8_t)
MT_INSTANTIATE_TENSOR_ACCESSORS(bool)
#undef MT_INSTANTIATE_TENSOR_ACCESSORS

// ---- factories ----

namespace {
void check_shape(const Shape& shape, const char* op) {
  MT_CHECK_T(ShapeError, shape.size() <= static_cast<size_t>(kMaxDims), op, ": shape ", shape_str(shape), " has ",
             shape.size(), " dimensions; at most ", kMaxDims, " are supported");
  for (int64_t s : shape) {
    MT_CHECK_T(ShapeError, s >= 0, op, ": negative size in shape ", shape_str(shape));
  }
}

Tensor finish(Tensor t, const TensorOptions& options) { return detail::apply_requires_grad(std::move(t), options); }
}  // namespace

Tensor empty(const Shape& shape, TensorOptions options) {
  check_shape(shape, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      Storage::allocate(static_cast<size_t>(shape_numel(shape)) * element_size(options.dtype()), options.device());
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype();
  return finish(Tensor(std::move(impl)), options);
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor t = empty(shape, options.requires_grad(false));
  t.fill_(value);
  return finish(t, options);
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  MT_CHECK(step != 0.0, "arange: step must be non-zero");
  MT_CHECK((end - start) / step >= 0, "arange: start ", start, ", end ", end, " and step ", step,
           " give a negative length");
  const auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  if (options.device().is_cuda()) {
    // Made on the device: a copy from host memory inside a captured CUDA Graph would re-read
    // that (by then freed) memory at every replay.
    Tensor out = empty({n}, options.requires_grad(false));
    kernels::arange_cuda(out, start, step);
    return finish(out, options);
  }
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = start + static_cast<double>(i) * step;
  return from_vector(values, {n}, options);
}

Tensor arange(int64_t end, TensorOptions options) { return arange(0.0, static_cast<double>(end), 1.0, options); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions options) {
  check_shape(shape, "from_vector");
  MT_CHECK_T(ShapeError, static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
             " values cannot fill shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
  return from_blob(values.data(), shape, DType::f64, options);
}

Tensor from_blob(const void* data, const Shape& shape, DType dtype, TensorOptions options) {
  check_shape(shape, "from_blob");
  // Wrap the caller's bytes without owning them, then copy (and convert) into a fresh tensor.
  auto view = std::make_shared<TensorImpl>();
  view->storage = Storage::allocate(static_cast<size_t>(shape_numel(shape)) * element_size(dtype), kCPU);
  if (view->storage->nbytes()) std::memcpy(view->storage->data(), data, view->storage->nbytes());
  view->shape = shape;
  view->strides = contiguous_strides(shape);
  view->dtype = dtype;
  Tensor host(std::move(view));
  return finish(raw::to(host, options.device(), options.dtype()), options);
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), TensorOptions().dtype(t.dtype()).device(t.device())); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions().dtype(t.dtype()).device(t.device())); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions().dtype(t.dtype()).device(t.device())); }

}  // namespace mt
