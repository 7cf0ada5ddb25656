// Runs an element-wise functor on the tensor's device: the CPU loop from
// ops/loops.h or its CUDA twin. The CUDA side is a template defined in
// ops/cuda/map_impl.cuh and explicitly instantiated, per functor, in the
// family's *_cuda.cu file (MT_INSTANTIATE_MAP_* below), so plain .cpp files can
// call it without seeing CUDA code.
#pragma once

#include "core/error.h"
#include "ops/loops.h"

namespace mt::ops {

template <typename Op>
void unary_cuda(const Tensor& out, const Tensor& in, const char* name, Op op);
template <typename Op>
void binary_cuda(const Tensor& out, const Tensor& a, const Tensor& b, const char* name, Op op);
template <typename Op>
void ternary_cuda(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, const char* name, Op op);

// CUDA only: out (f32) = op(a, b) where a or b is f16/bf16 and the other f32 (or half),
// all dense and of out's shape, the half inputs widened in registers (the values of
// widening them first). Returns false, having done nothing, when that does not hold.
template <typename Op>
bool binary_f32_from_mixed_cuda(const Tensor& out, const Tensor& a, const Tensor& b, Op op);

[[noreturn]] void throw_no_cuda(const char* op);

template <typename Op>
void run_unary(const Tensor& out, const Tensor& in, const char* name, Op op) {
  if (out.is_cuda()) {
#if MT_WITH_CUDA
    unary_cuda(out, in, name, op);
#else
    throw_no_cuda(name);
#endif
  } else {
    cpu::map_unary(out, in, name, op);
  }
}

template <typename Op>
void run_binary(const Tensor& out, const Tensor& a, const Tensor& b, const char* name, Op op) {
  if (out.is_cuda()) {
#if MT_WITH_CUDA
    binary_cuda(out, a, b, name, op);
#else
    throw_no_cuda(name);
#endif
  } else {
    cpu::map_binary(out, a, b, name, op);
  }
}

template <typename Op>
void run_ternary(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, const char* name, Op op) {
  if (out.is_cuda()) {
#if MT_WITH_CUDA
    ternary_cuda(out, a, b, c, name, op);
#else
    throw_no_cuda(name);
#endif
  } else {
    cpu::map_ternary(out, a, b, c, name, op);
  }
}

}  // namespace mt::ops
