// SwiGLU: validation, forward and the one-pass backward, and the CPU loops.
#include "ops/elementwise/swiglu.h"

#include "autograd/function.h"
#include "core/cpu_loops.h"
#include "ops/common.h"
#include "ops/elementwise/swiglu_kernels.h"
#include "ops/map.h"

namespace mt {

namespace {

constexpr const char* kOp = "swiglu";

Tensor forward(const Tensor& gate, const Tensor& up) {
  Tensor out = empty(gate.shape(), ops::options_of(gate));
  if (gate.numel() == 0) return out;
  if (gate.is_cuda()) {
#if MT_WITH_CUDA
    ops::swiglu_forward_cuda(out, gate, up);
#else
    ops::throw_no_cuda(kOp);
#endif
  } else {
    ops::swiglu_forward_cpu(out, gate, up);
  }
  return out;
}

std::vector<Tensor> backward(const Tensor& dy_in, const Tensor& gate, const Tensor& up) {
  const Tensor dy = ops::as_dtype(dy_in, gate.dtype()).contiguous();
  Tensor dgate = empty(gate.shape(), ops::options_of(gate)), dup = empty(gate.shape(), ops::options_of(gate));
  if (gate.numel() == 0) return {dgate, dup};
  if (gate.is_cuda()) {
#if MT_WITH_CUDA
    ops::swiglu_backward_cuda(dgate, dup, dy, gate, up);
#else
    ops::throw_no_cuda(kOp);
#endif
  } else {
    ops::swiglu_backward_cpu(dgate, dup, dy, gate, up);
  }
  return {dgate, dup};
}

}  // namespace

Tensor swiglu(const Tensor& gate_in, const Tensor& up_in) {
  ops::check_floating(kOp, gate_in);
  ops::check_floating(kOp, up_in);
  ops::check_same_device(kOp, gate_in, up_in);
  MT_CHECK_T(ShapeError, gate_in.shape() == up_in.shape(), kOp, ": gate and up must have one shape, got gate ",
             ops::describe(gate_in), ", up ", ops::describe(up_in));
  MT_CHECK_T(DTypeError, gate_in.dtype() == up_in.dtype(), kOp, ": gate and up must have one dtype, got gate ",
             ops::describe(gate_in), ", up ", ops::describe(up_in));
  const Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  Tensor out = forward(gate, up);
  if (autograd::needs_grad({gate_in, up_in})) {
    auto node = std::make_shared<autograd::LambdaNode>(
        "SwigluBackward", [](const std::vector<Tensor>& g, const autograd::LambdaNode& self) {
          return backward(g[0], self.saved_tensor("gate"), self.saved_tensor("up"));
        });
    node->save("gate", gate);
    node->save("up", up);
    // The output is one pass over what the node keeps anyway: a projection saving it as its input
    // may keep this recipe instead (autograd::RebuildSavedGuard).
    node->set_rebuild(0, [](const autograd::LambdaNode& self) {
      return forward(self.saved_tensor("gate"), self.saved_tensor("up"));
    });
    autograd::record(node, {gate_in, up_in}, {out});
  }
  return out;
}

namespace ops {

void swiglu_forward_cpu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  dispatch_floating(gate.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* g = static_cast<const T*>(gate.data_ptr());
    const T* u = static_cast<const T*>(up.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    cpu::parallel_for(gate.numel(), cpu::kParallelGrain, [&](int64_t first, int64_t end) {
      for (int64_t i = first; i < end; ++i) y[i] = convert<T>(SwigluMath::forward(convert<A>(g[i]), convert<A>(u[i])));
    });
  });
}

void swiglu_backward_cpu(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                         const Tensor& up) {
  dispatch_floating(gate.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* d = static_cast<const T*>(dy.data_ptr());
    const T* g = static_cast<const T*>(gate.data_ptr());
    const T* u = static_cast<const T*>(up.data_ptr());
    T* dg = static_cast<T*>(dgate.data_ptr());
    T* du = static_cast<T*>(dup.data_ptr());
    cpu::parallel_for(gate.numel(), cpu::kParallelGrain, [&](int64_t first, int64_t end) {
      for (int64_t i = first; i < end; ++i) {
        A a = 0, b = 0;
        SwigluMath::backward(convert<A>(d[i]), convert<A>(g[i]), convert<A>(u[i]), &a, &b);
        dg[i] = convert<T>(a);
        du[i] = convert<T>(b);
      }
    });
  });
}

}  // namespace ops
}  // namespace mt
