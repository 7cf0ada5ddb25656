// Copies from global to shared memory that no register holds while they are in flight
// (cp.async, sm_80 and later). A row kernel that loads into registers keeps as many bytes in
// flight as its registers hold, and at one row per warp that left the norms waiting on memory
// latency; staged through shared memory, a warp can have its next rows on the way while it
// works on one. Before sm_80 the copy is a plain 16-byte load and store, and commit and wait do
// nothing (the data is there when the copy returns).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::cuda {

// 16 bytes from global_src to shared_dst, both 16-byte aligned; cached in L2 only (.cg), as
// streamed rows are read once.
__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
#else
  *static_cast<uint4*>(shared_dst) = *static_cast<const uint4*>(global_src);
#endif
}

// Closes the copies this thread issued since its last commit into one group (possibly empty).
__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most `pending` (0 to 3) of this thread's groups are still in flight: the data of
// the others is then in shared memory, visible to this thread (other threads need a barrier).
__device__ __forceinline__ void wait_async_copies(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  switch (pending) {  // the count is an immediate operand
    case 0:
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      break;
    case 1:
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      break;
    case 2:
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");
      break;
    default:
      asm volatile("cp.async.wait_group 3;\n" ::: "memory");
      break;
  }
#else
  (void)pending;
#endif
}

// Asks the L2 to fetch [p, p + bytes) from device memory (sm_90 and later: one bulk prefetch of
// the 16-byte-aligned span inside it, issued by the calling thread alone; before sm_90 nothing).
// A hint, not an access: it loads nothing into registers or shared memory and orders nothing,
// so a programmatic dependent (core/cuda/dependent_launch.cuh) may issue it before
// wait_for_prerequisite_grids even for memory that the kernel before it writes: those writes land
// in the L2, over what the prefetch brought, and the prefetch fills no L1, so no later load can
// see a stale line through it.
__device__ __forceinline__ void prefetch_to_l2(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t(15);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t(15);
  if (end > start) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(start), "r"(static_cast<unsigned>(end - start))
                 : "memory");
  }
#else
  (void)p, (void)bytes;
#endif
}

}  // namespace mt::cuda
