// Multi-tensor apply (after PyTorch's ATen/native/cuda/MultiTensorApply.cuh):
// one kernel launch works on a whole list of tensors, so an optimizer step or a
// gradient-norm pass costs a handful of launches instead of one per parameter.
// The tables and the launch planning live in optim/multi_tensor.h.
//
// An op is a copyable struct (its fields are the kernel's other arguments) with
//   __device__ void operator()(const MultiTensorBlock<Depth>& block) const;
// run by every thread of a kMultiTensorThreads-thread block; it handles
// elements [block.begin, block.end) of the tensor at block.ptr[d] in each list.
// Tensors must be contiguous, the lists of one slot of equal size, all on the
// stream's device. The addresses are untyped, so the lists of one slot may hold
// different dtypes (bf16 params with f32 moments); the caller groups slots so
// that one op instantiation sees one type per list.
//
//   multi_tensor_apply<1>(grads_of_one_dtype, ScaleOp<T>{coef_ptr}, stream);
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "core/cuda/check.h"
#include "core/tensor.h"
#include "ops/common.h"
#include "optim/multi_tensor.h"

namespace mt::optim_kernels {

constexpr int kMultiTensorThreads = 512;

// __grid_constant__: the op reads the tables straight from parameter space
// through a reference, with no per-thread copy.
template <int Depth, typename Op>
__global__ void __launch_bounds__(kMultiTensorThreads)
    multi_tensor_kernel(const __grid_constant__ TensorListMetadata<Depth> meta, const Op op) {
  op(multi_tensor_block(meta, static_cast<int>(blockIdx.x)));
}

// Runs `op` over every chunk of every slot of `tensors`, on `stream`.
template <int Depth, typename Op>
void multi_tensor_apply(const std::vector<std::array<Tensor, Depth>>& tensors, const Op& op, cudaStream_t stream,
                        const MultiTensorConfig& config = {}) {
  for (const std::array<Tensor, Depth>& slot : tensors) {
    for (int d = 0; d < Depth; ++d) {
      MT_INTERNAL_ASSERT(slot[d].is_contiguous() && slot[d].is_cuda(), "multi_tensor_apply: list ", d, " holds ",
                         ops::describe(slot[d]));
    }
  }
  plan_multi_tensor_launches<Depth>(tensors, config, [&](const TensorListMetadata<Depth>& meta, int blocks) {
    multi_tensor_kernel<Depth, Op><<<blocks, kMultiTensorThreads, 0, stream>>>(meta, op);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::optim_kernels
