// The [autograd] methods of Tensor (declared in core/tensor.h).
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/node.h"
#include "core/view.h"

namespace mt {

using autograd::meta;
using autograd::meta_if_exists;

bool Tensor::requires_grad() const { return autograd::requires_grad(*this); }

Tensor& Tensor::requires_grad_(bool requires_grad) {
  autograd::AutogradMeta& m = meta(*this);
  MT_CHECK(!m.grad_fn || requires_grad, "requires_grad_: cannot turn off requires_grad on a non-leaf tensor (",
           m.grad_fn->name(), "); use detach()");
  if (requires_grad) {
    MT_CHECK_T(DTypeError, is_floating(dtype()), "requires_grad_: only floating tensors can require grad; got ",
               dtype_name(dtype()));
  }
  m.requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  const autograd::AutogradMeta* m = meta_if_exists(*this);
  return m == nullptr || !m->grad_fn;
}

Tensor Tensor::grad() const {
  const autograd::AutogradMeta* m = meta_if_exists(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    MT_CHECK_T(ShapeError, grad.shape() == shape(), "set_grad: gradient of shape ", shape_str(grad.shape()),
               " for a tensor of shape ", shape_str(shape()));
  }
  meta(*this).grad = grad;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  const autograd::AutogradMeta* m = meta_if_exists(*this);
  return m ? m->grad_fn : nullptr;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>(*checked());
  impl->autograd_meta = nullptr;
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::run_backward({*this}, {gradient}, retain_graph);
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  MT_CHECK(requires_grad(), "register_hook: the tensor does not require grad");
  autograd::AutogradMeta& m = meta(*this);
  if (m.grad_fn) {
    m.grad_fn->output_hooks.emplace_back(m.output_nr, std::move(hook));
  } else {
    m.leaf_hooks.push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  MT_CHECK(requires_grad() && is_leaf(),
           "register_post_accumulate_grad_hook: only leaf tensors that require grad accumulate gradients");
  meta(*this).post_accumulate_hooks.push_back(std::move(hook));
}

// The differentiable conversions live here rather than beside the differentiable views
// (ops/shape/shape.cpp): autocast records its casts through them, and they need nothing but
// core's copy (raw::to) and a node whose backward converts the gradient back.
namespace {

template <typename Back>
Tensor record_conversion(const char* name, const Tensor& input, Tensor out, Back back) {
  if (autograd::needs_grad({input})) {
    auto node = std::make_shared<autograd::LambdaNode>(
        name, [back](const std::vector<Tensor>& g, const autograd::LambdaNode& self) {
          return std::vector<Tensor>{back(g[0], self.input_meta[0])};
        });
    autograd::record(node, {input}, {out});
  }
  return out;
}

}  // namespace

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  return record_conversion("ToDeviceBackward", *this, raw::to(*this, device),
                           [](const Tensor& g, const autograd::TensorMeta& m) { return g.to(m.device); });
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  if (requires_grad()) {
    MT_CHECK_T(DTypeError, is_floating(dtype), "to: cannot cast a tensor that requires grad to ", dtype_name(dtype),
               " (gradients need a floating dtype)");
  }
  return record_conversion("CastBackward", *this, raw::to(*this, dtype),
                           [](const Tensor& g, const autograd::TensorMeta& m) { return g.to(m.dtype); });
}

}  // namespace mt
