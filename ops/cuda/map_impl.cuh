// Definitions behind ops/map.h's CUDA declarations, and the macros a family's
// .cu file uses to instantiate them for its functors.
#pragma once

#include "ops/cuda/loops.cuh"
#include "ops/map.h"

namespace mt::ops {

template <typename Op>
void unary_cuda(const Tensor& out, const Tensor& in, const char* name, Op op) {
  cuda::map_unary(out, in, name, op);
}
template <typename Op>
void binary_cuda(const Tensor& out, const Tensor& a, const Tensor& b, const char* name, Op op) {
  cuda::map_binary(out, a, b, name, op);
}
template <typename Op>
bool binary_f32_from_mixed_cuda(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  return cuda::map_binary_f32_from_mixed(out, a, b, op);
}
template <typename Op>
void ternary_cuda(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, const char* name, Op op) {
  cuda::map_ternary(out, a, b, c, name, op);
}

}  // namespace mt::ops

#define MT_INSTANTIATE_MAP_UNARY(Op) \
  template void mt::ops::unary_cuda<Op>(const Tensor&, const Tensor&, const char*, Op)
#define MT_INSTANTIATE_MAP_BINARY(Op) \
  template void mt::ops::binary_cuda<Op>(const Tensor&, const Tensor&, const Tensor&, const char*, Op)
#define MT_INSTANTIATE_MAP_BINARY_F32_FROM_MIXED(Op) \
  template bool mt::ops::binary_f32_from_mixed_cuda<Op>(const Tensor&, const Tensor&, const Tensor&, Op)
#define MT_INSTANTIATE_MAP_TERNARY(Op) \
  template void mt::ops::ternary_cuda<Op>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const char*, Op)
