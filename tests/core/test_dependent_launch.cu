// Programmatic dependent launch inside a captured CUDA Graph (core/cuda/dependent_launch.cuh):
// the allocator keeps the memory nodes it captures beside the stream's chain of kernels
// (core/cuda/context.cu), so that a kernel launched by launch_dependent still starts while the
// kernel before it runs when an allocation or a free was captured between them. Each kernel
// here stamps %globaltimer as it starts (before its wait) and as it ends.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda_context.h"
#include "tests/test_util.h"

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread: stamps its start, waits for the kernel before it, lets the next one launch,
// writes a byte of `scratch` (when given: the memory the capture allocated for it), runs for
// `busy_ns` and stamps its end. The stamps are written after the wait, as a launch_dependent
// kernel must.
__global__ void stamped_kernel(uint64_t* stamps, unsigned char* scratch, uint64_t busy_ns) {
  const uint64_t start = global_ns();
  mt::cuda::wait_for_prerequisite_grids();
  mt::cuda::allow_dependent_grids();
  if (scratch != nullptr) scratch[0] = 1;
  while (global_ns() < start + busy_ns) {
  }
  stamps[0] = start;
  stamps[1] = global_ns();
}

TEST(CudaGraphs, DependentKernelsOverlapAcrossCapturedAllocationsAndFrees) {
  MT_SKIP_WITHOUT_CUDA();
  const int device = 0;
  if (!mt::cuda::dependent_launch_enabled(device)) {
    GTEST_SKIP() << "programmatic dependent launch is off on cuda:0 (it needs sm_90 or later, and "
                    "MT_DEPENDENT_LAUNCH not 0)";
  }
  const mt::cuda::Stream stream = mt::cuda::current_stream(device);
  const size_t stamp_bytes = 6 * sizeof(uint64_t);
  auto* stamps = static_cast<uint64_t*>(mt::cuda::allocate(stamp_bytes, device, stream.handle()));
  const uint64_t busy_ns = 200 * 1000;  // long enough that a late start cannot pass for overlap
  const auto launch = [&](int k, void* scratch, uint64_t ns) {
    mt::cuda::launch_dependent(stamped_kernel, dim3(1), dim3(1), 0, stream.handle(), device, stamps + 2 * k,
                               static_cast<unsigned char*>(scratch), ns);
  };
  mt::cuda::Graph graph;
  graph.capture(stream, [&] {
    launch(0, nullptr, busy_ns);
    void* scratch = mt::cuda::allocate(1 << 20, device, stream.handle());  // an allocation node between 0 and 1
    launch(1, scratch, busy_ns);
    mt::cuda::deallocate(scratch, 1 << 20, device, stream.handle());  // a free node between 1 and 2
    launch(2, nullptr, 0);
  });
  // The first replay also maps the graph's memory: the stamps are read after the third.
  std::vector<uint64_t> t(6);
  for (int replay = 0; replay < 3; ++replay) {
    graph.replay(stream);
    MT_CUDA_CHECK(cudaMemcpyAsync(t.data(), stamps, stamp_bytes, cudaMemcpyDeviceToHost, stream.handle()));
    MT_CUDA_CHECK(cudaStreamSynchronize(stream.handle()));
    std::printf("replay %d: kernel 1 started %+.2f us and kernel 2 %+.2f us from the end of the kernel before it\n",
                replay, (static_cast<double>(t[2]) - static_cast<double>(t[1])) / 1000.0,
                (static_cast<double>(t[4]) - static_cast<double>(t[3])) / 1000.0);
  }
  mt::cuda::deallocate(stamps, stamp_bytes, device, stream.handle());
  EXPECT_LT(t[2], t[1]) << "the kernel after a captured allocation started only after the kernel before it ended";
  EXPECT_LT(t[4], t[3]) << "the kernel after a captured free started only after the kernel before it ended";
  EXPECT_GE(t[4], t[1]) << "a kernel ran before the kernel two before it had ended";  // the chain holds
}

}  // namespace
