// Programmatic dependent launch (sm_90 and later). Between two kernels of one stream the GPU
// otherwise idles for about a microsecond: the first drains, its memory is flushed, then the
// second's blocks are scheduled. A kernel launched by launch_dependent may have its blocks
// scheduled while the kernel before it is still running, once every block of that kernel has
// called allow_dependent_grids (or exited); they start at once where the earlier kernel's
// blocks have left room, and wait in wait_for_prerequisite_grids until it has completed and
// its writes are visible. So a kernel launched this way calls wait_for_prerequisite_grids
// before its first write to global memory (the earlier kernel may still read it) and before
// reading anything the earlier kernel may write; only inputs that no kernel can write in
// between (the tensors a forward saved, for its backward) may be read before. Any input may be
// prefetched to the L2 before (prefetch_to_l2, core/cuda/async_copy.cuh): a prefetch reads
// nothing. Kernels launched with <<<>>> are unaffected: for them the wait returns at once, and
// the earlier kernel's signal does nothing. In a captured graph the allocator keeps its memory
// nodes out of the way (core/cuda/context.cu): a memory node between two kernels would make the
// second wait for the first to end. One kernel departs from the rule above, by design: the norms'
// final sum of the parameter gradients reads the partial rows while the backward before it writes
// them, and waits only at its end (ops/norm/norm_final_sum.cuh).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.h"

namespace mt::cuda {

// Waits until the kernels this one depends on have completed and their memory is visible.
__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel of the stream, if launched by launch_dependent, be scheduled once every
// block of this one has called it. Safe at any point: the next kernel still waits for this one
// to complete before it touches memory.
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the kernel
// before it in the stream where dependent_launch_enabled(device) (core/cuda/dependent_launch.h).
// The kernel calls wait_for_prerequisite_grids as the header above says. Checks the launch.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, int device,
                      Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (dependent_launch_enabled(device)) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  MT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace mt::cuda
