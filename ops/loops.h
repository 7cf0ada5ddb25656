// CPU element loops shared by the op families. Inputs are already broadcast to
// the output's shape (raw::expand) and share its dtype; arithmetic happens in
// acc_t<T> (float for f16/bf16, double for f64). Functors are the same structs
// the CUDA loops (ops/cuda/loops.cuh) run, so CPU and CUDA compute one formula.
#pragma once

#include <initializer_list>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "core/tensor.h"

namespace mt::cpu {

// Whether `out` and every input are dense with the same layout (the inputs already have out's
// shape), so that element i of each sits at offset i, and no input overlaps out other than by
// being it: then the loop runs as for_each_dense, each element computed as the strided walk would.
inline bool dense_alike(const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  if (!out.is_contiguous()) return false;
  const char* o = static_cast<const char*>(out.data_ptr());
  const int64_t bytes = out.numel() * static_cast<int64_t>(element_size(out.dtype()));
  for (const Tensor* t : inputs) {
    if (!t->is_contiguous()) return false;
    const char* p = static_cast<const char*>(t->data_ptr());
    if (p != o && p < o + bytes && o < p + bytes) return false;  // a partial overlap: keep the walk's order
  }
  return true;
}

template <typename Op>
void map_unary(const Tensor& out, const Tensor& in, const char* name, Op op) {
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(in.data_ptr());
    if (dense_alike(out, {&in})) {
      for_each_dense(out.numel(), [&](int64_t i) { o[i] = convert<T>(op(convert<A>(x[i]))); });
      return;
    }
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
    if (dense_alike(out, {&a, &b})) {
      for_each_dense(out.numel(), [&](int64_t i) { o[i] = convert<T>(op(convert<A>(x[i]), convert<A>(y[i]))); });
      return;
    }
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
    if (dense_alike(out, {&a, &b, &c})) {
      for_each_dense(out.numel(),
                     [&](int64_t i) { o[i] = convert<T>(op(convert<A>(x[i]), convert<A>(y[i]), convert<A>(z[i]))); });
      return;
    }
    for_each_strided<4>(out.shape(), {&out.strides(), &a.strides(), &b.strides(), &c.strides()}, [&](const auto& off) {
      o[off[0]] = convert<T>(op(convert<A>(x[off[1]]), convert<A>(y[off[2]]), convert<A>(z[off[3]])));
    });
  });
}

}  // namespace mt::cpu
