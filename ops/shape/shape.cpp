// The differentiable view methods of Tensor (declared in core/tensor.h; the
// conversions, to(), are in autograd/tensor_autograd.cpp). Forward is the raw view
// from core/view.h; backward maps the gradient back through the inverse view.
#include <numeric>

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/reduction/reduction.h"
#include "ops/shape/shape.h"

namespace mt {

using autograd::LambdaNode;

namespace {

// Records a one-input, one-output view or conversion whose backward is `backward(grad, input_meta)`.
template <typename Backward>
Tensor record_unary(const char* name, const Tensor& input, Tensor out, Backward backward) {
  if (autograd::needs_grad({input})) {
    // A view must not share autograd meta with its base: give it its own.
    if (out.impl() == input.impl()) out = out.detach();
    auto node = std::make_shared<LambdaNode>(name, [backward](const std::vector<Tensor>& g, const LambdaNode& self) {
      return std::vector<Tensor>{backward(g[0], self.input_meta[0])};
    });
    autograd::record(node, {input}, {out});
  }
  return out;
}

// A gradient for a window of the input: zeros elsewhere.
Tensor scatter_into_zeros(const Tensor& grad, const autograd::TensorMeta& meta,
                          const std::function<Tensor(const Tensor&)>& window) {
  Tensor full = zeros(meta.shape, TensorOptions().dtype(grad.dtype()).device(grad.device()));
  window(full).copy_(grad);
  return full;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  return record_unary("ViewBackward", *this, raw::view(*this, shape),
                      [](const Tensor& g, const autograd::TensorMeta& m) { return g.reshape(m.shape); });
}

Tensor Tensor::reshape(const Shape& shape) const {
  return record_unary("ReshapeBackward", *this, raw::reshape(*this, shape),
                      [](const Tensor& g, const autograd::TensorMeta& m) { return g.reshape(m.shape); });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  return record_unary("TransposeBackward", *this, raw::transpose(*this, d0, d1),
                      [d0, d1](const Tensor& g, const autograd::TensorMeta&) { return g.transpose(d0, d1); });
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  Tensor out = raw::permute(*this, dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[static_cast<size_t>(raw::wrap_dim(dims[i], dim(), "permute"))] = static_cast<int64_t>(i);
  return record_unary("PermuteBackward", *this, out,
                      [inverse](const Tensor& g, const autograd::TensorMeta&) { return g.permute(inverse); });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  return record_unary("NarrowBackward", *this, raw::narrow(*this, d, start, length),
                      [d, start, length](const Tensor& g, const autograd::TensorMeta& m) {
                        return scatter_into_zeros(g, m,
                                                  [&](const Tensor& f) { return raw::narrow(f, d, start, length); });
                      });
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  return record_unary("SliceBackward", *this, raw::slice(*this, d, start, end, step),
                      [d, start, end, step](const Tensor& g, const autograd::TensorMeta& m) {
                        return scatter_into_zeros(g, m,
                                                  [&](const Tensor& f) { return raw::slice(f, d, start, end, step); });
                      });
}

Tensor Tensor::expand(const Shape& shape) const {
  return record_unary("ExpandBackward", *this, raw::expand(*this, shape),
                      [](const Tensor& g, const autograd::TensorMeta& m) { return sum_to(g, m.shape); });
}

Tensor Tensor::squeeze(int64_t d) const {
  return record_unary("SqueezeBackward", *this, raw::squeeze(*this, d),
                      [](const Tensor& g, const autograd::TensorMeta& m) { return g.reshape(m.shape); });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  return record_unary("UnsqueezeBackward", *this, raw::unsqueeze(*this, d),
                      [](const Tensor& g, const autograd::TensorMeta& m) { return g.reshape(m.shape); });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return record_unary("ContiguousBackward", *this, raw::contiguous(*this),
                      [](const Tensor& g, const autograd::TensorMeta&) { return g; });
}

Tensor Tensor::clone() const {
  return record_unary("CloneBackward", *this, raw::clone(*this),
                      [](const Tensor& g, const autograd::TensorMeta&) { return g; });
}

Tensor reshape(const Tensor& x, const Shape& shape) { return x.reshape(shape); }
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) { return x.transpose(d0, d1); }
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) { return x.permute(dims); }
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return x.slice(dim, start, end, step);
}
Tensor expand(const Tensor& x, const Shape& shape) { return x.expand(shape); }
Tensor cast(const Tensor& x, DType dtype) { return x.to(dtype); }

}  // namespace mt
