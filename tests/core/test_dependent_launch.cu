// Programmatic dependent launch inside a captured CUDA Graph (core/cuda/dependent_launch.cuh):
// inside a DependentLaunchScope the allocator keeps the allocations it captures beside the
// stream's chain of kernels (core/cuda/context.cu), so that a kernel launched by
// launch_dependent after them still starts while the kernel before it runs; elsewhere, and
// after a free, the kernel waits. Each kernel here stamps %globaltimer as it starts (before
// its wait) and as it ends.
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

// Each case runs with the dependent launch on (as by default) on cuda:0, and restores
// the setting after; skipped without CUDA or below sm_90.
class CudaGraphsWithDependentLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_WITHOUT_CUDA();
    if (!mt::cuda::dependent_launch_enabled(device)) {
      GTEST_SKIP() << "programmatic dependent launch needs sm_90 or later; cuda:0 is sm_"
                   << mt::cuda::compute_capability(device);
    }
  }
  const int device = 0;

 private:
  const mt::cuda::DependentLaunchGuard dependent_launch_{true};
};

TEST_F(CudaGraphsWithDependentLaunch, DependentKernelsOverlapOnlyAcrossAllocationsInADependentLaunchScope) {
  const mt::cuda::Stream stream = mt::cuda::current_stream(device);
  constexpr int kKernels = 4;
  const size_t stamp_bytes = 2 * kKernels * sizeof(uint64_t);
  auto* stamps = static_cast<uint64_t*>(mt::cuda::allocate(stamp_bytes, device, stream.handle()));
  const uint64_t busy_ns = 200 * 1000;  // long enough that a late start cannot pass for overlap
  const auto launch = [&](int k, void* scratch, uint64_t ns) {
    mt::cuda::launch_dependent(stamped_kernel, dim3(1), dim3(1), 0, stream.handle(), device, stamps + 2 * k,
                               static_cast<unsigned char*>(scratch), ns);
  };
  const size_t bytes = 1 << 20;
  mt::cuda::Graph graph;
  graph.capture(stream, [&] {
    launch(0, nullptr, busy_ns);
    void* scoped = nullptr;
    {
      const mt::cuda::DependentLaunchScope scope;  // an allocation between 0 and 1, beside the chain
      scoped = mt::cuda::allocate(bytes, device, stream.handle());
    }
    launch(1, scoped, busy_ns);
    mt::cuda::deallocate(scoped, bytes, device, stream.handle());  // a free between 1 and 2
    launch(2, nullptr, busy_ns);
    void* plain = mt::cuda::allocate(bytes, device, stream.handle());  // outside a scope: in the chain
    launch(3, plain, 0);
    mt::cuda::deallocate(plain, bytes, device, stream.handle());
  });
  // The first replay also maps the graph's memory: the stamps are read after the third.
  std::vector<uint64_t> t(2 * kKernels);
  const auto start_after_end_us = [&](int k) {
    return (static_cast<double>(t[2 * k]) - static_cast<double>(t[2 * k - 1])) / 1000.0;
  };
  for (int replay = 0; replay < 3; ++replay) {
    graph.replay(stream);
    MT_CUDA_CHECK(cudaMemcpyAsync(t.data(), stamps, stamp_bytes, cudaMemcpyDeviceToHost, stream.handle()));
    MT_CUDA_CHECK(cudaStreamSynchronize(stream.handle()));
    std::printf("replay %d: kernels 1, 2, 3 started %+.2f, %+.2f, %+.2f us from the end of the kernel before\n", replay,
                start_after_end_us(1), start_after_end_us(2), start_after_end_us(3));
  }
  mt::cuda::deallocate(stamps, stamp_bytes, device, stream.handle());
  EXPECT_LT(start_after_end_us(1), 0) << "the kernel after an allocation in a DependentLaunchScope waited";
  EXPECT_GE(start_after_end_us(2), 0) << "the kernel after a free started early";
  EXPECT_GE(start_after_end_us(3), 0) << "the kernel after an allocation outside a scope started early";
}

// Allocations kept beside the chain still reuse the memory the graph freed before the last
// kernel: eight 64 MiB buffers, each allocated in a scope, written by one kernel and freed,
// must not take eight buffers' worth of graph memory (each may take the memory freed two
// kernels before it: three buffers at most).
TEST_F(CudaGraphsWithDependentLaunch, AllocationsInADependentLaunchScopeReuseFreedGraphMemory) {
  const mt::cuda::Stream stream = mt::cuda::current_stream(device);
  auto* stamps = static_cast<uint64_t*>(mt::cuda::allocate(2 * sizeof(uint64_t), device, stream.handle()));
  const size_t bytes = size_t{64} << 20;
  constexpr int kBuffers = 8;
  mt::cuda::Graph graph;
  graph.capture(stream, [&] {
    for (int i = 0; i < kBuffers; ++i) {
      void* buffer = nullptr;
      {
        const mt::cuda::DependentLaunchScope scope;
        buffer = mt::cuda::allocate(bytes, device, stream.handle());
      }
      mt::cuda::launch_dependent(stamped_kernel, dim3(1), dim3(1), 0, stream.handle(), device, stamps,
                                 static_cast<unsigned char*>(buffer), uint64_t{0});
      mt::cuda::deallocate(buffer, bytes, device, stream.handle());
    }
  });
  MT_CUDA_CHECK(cudaDeviceGraphMemTrim(device));
  size_t zero = 0;
  MT_CUDA_CHECK(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero));
  graph.replay(stream);
  MT_CUDA_CHECK(cudaStreamSynchronize(stream.handle()));
  size_t high = 0;
  MT_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &high));
  mt::cuda::deallocate(stamps, 2 * sizeof(uint64_t), device, stream.handle());
  EXPECT_LE(high, 3 * bytes) << "the graph's memory high-water mark: " << (high >> 20) << " MiB";
  EXPECT_GE(high, bytes) << "the graph's memory high-water mark: " << (high >> 20) << " MiB";
}

}  // namespace
