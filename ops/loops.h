// CPU element loops shared by the op families. Inputs are already broadcast to
// the output's shape (raw::expand) and share its dtype; arithmetic happens in
// acc_t<T> (float for f16/bf16, double for f64). Functors are the same structs
// the CUDA loops (ops/cuda/loops.cuh) run, so CPU and CUDA compute one formula.
#pragma once

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "core/tensor.h"

namespace mt::cpu {

template <typename Op>
void map_unary(const Tensor& out, const Tensor& in, const char* name, Op op) {
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(in.data_ptr());
    for_each_strided<2>(out.shape(), {&out.strides(), &in.strides()},
                        [&](const auto& off) { o[off[0]] = convert<T>(op(convert<A>(x[off[1]]))); });
  });
}

template <typename Op>
void map_binary(const Tensor& out, const Tensor& a, const Tensor& b, const char* name, Op op) {
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    for_each_strided<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()}, [&](const auto& off) {
      o[off[0]] = convert<T>(op(convert<A>(x[off[1]]), convert<A>(y[off[2]])));
    });
  });
}

template <typename Op>
void map_ternary(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, const char* name, Op op) {
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    const T* z = static_cast<const T*>(c.data_ptr());
    for_each_strided<4>(out.shape(), {&out.strides(), &a.strides(), &b.strides(), &c.strides()}, [&](const auto& off) {
      o[off[0]] = convert<T>(op(convert<A>(x[off[1]]), convert<A>(y[off[2]]), convert<A>(z[off[3]])));
    });
  });
}

}  // namespace mt::cpu
