// The staged-launch planner of the warp-per-row norm kernels (norm_launch_plan.h): the kernels'
// and devices' facts, queried once per (kernel, device) and cached under a lock, since the norms
// launch often and these are driver calls. A kernel's dynamic shared memory attribute is only
// ever raised, so a launch of a size planned before still fits.
#include "ops/norm/norm_launch_plan.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "ops/norm/norm_warp_rows.cuh"

namespace mt::ops::norm_detail {

namespace {

// What the staged launches need to know of a kernel on a device: its static shared memory, the
// dynamic shared memory it may take so far, the device's limits, and its resident blocks per SM
// by dynamic size. Cached (queried on that device once): these are driver calls, and the norms
// launch often.
struct KernelFacts {
  bool queried = false;
  size_t static_smem = 0;
  size_t allowed_smem = 0;  // cudaFuncAttributeMaxDynamicSharedMemorySize; only ever raised
  int smem_per_block = 0;   // the device's opt-in limit
  int sms = 0;
  std::map<size_t, int> resident_blocks;  // per SM, by dynamic shared memory
};

KernelFacts& facts_of(const void* kernel, int device) {
  static std::map<std::pair<const void*, int>, KernelFacts> known;
  KernelFacts& facts = known[{kernel, device}];
  if (!facts.queried) {
    const cuda::DeviceGuard on_device(device);
    cudaFuncAttributes attributes{};
    MT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    facts.static_smem = attributes.sharedSizeBytes;
    facts.allowed_smem = static_cast<size_t>(attributes.maxDynamicSharedSizeBytes);
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&facts.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&facts.sms, cudaDevAttrMultiProcessorCount, device));
    facts.queried = true;
  }
  return facts;
}

// Resident blocks per SM of `kernel` with `smem` bytes of dynamic shared memory, after letting it
// take that much. The attribute is never lowered: a launch of a size seen before must still fit.
int resident_blocks_per_sm(const void* kernel, int device, KernelFacts& facts, size_t smem) {
  const auto found = facts.resident_blocks.find(smem);
  if (found != facts.resident_blocks.end()) return found->second;
  const cuda::DeviceGuard on_device(device);
  if (smem > facts.allowed_smem) {
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    facts.allowed_smem = smem;
  }
  int per_sm = 0;
  MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpRowBlock, smem));
  facts.resident_blocks.emplace(smem, per_sm);
  return per_sm;
}

// The launch of a warp-per-row kernel whose streamed operands take `row_bytes` per row (each
// padded to kPerLane * 32 elements), after `fixed_smem` bytes of its own (the f32 parameters): as
// many stages as kWantedStages and the device's shared memory allow without fewer resident blocks
// than the unstaged kernel's registers leave (on devices with less shared memory per SM the rings
// would otherwise cost resident blocks), on at most `blocks` blocks (0: as many as are
// resident at once, every warp looping over rows); unstaged on warp_row_grid(rows) blocks (at most
// `blocks`) when kStageable is false, row_bytes exceeds max_staged_row_bytes (the limit of the

}  // namespace

// kernel's direction, above) or no stage fits.
template <bool kStageable>
StagedLaunch plan_staged_launch(const void* kernel, int device, size_t fixed_smem, size_t row_bytes,
                                size_t max_staged_row_bytes, int64_t rows, int64_t blocks) {
  StagedLaunch plan;
  plan.grid = warp_row_grid(rows);
  plan.smem = fixed_smem;
  if (blocks > 0) plan.grid = static_cast<unsigned>(std::min<int64_t>(plan.grid, blocks));
  if constexpr (kStageable) {
    constexpr int kWarps = kWarpRowBlock / rowwise::kWarpSize;
    static std::mutex mutex;
    const std::lock_guard<std::mutex> lock(mutex);
    KernelFacts& facts = facts_of(kernel, device);
    const int64_t room =
        static_cast<int64_t>(facts.smem_per_block) - static_cast<int64_t>(facts.static_smem + fixed_smem);
    const auto staged_smem = [&](int stages) { return fixed_smem + static_cast<size_t>(stages) * kWarps * row_bytes; };
    int stages = row_bytes > max_staged_row_bytes || room <= 0
                     ? 0
                     : static_cast<int>(std::min<int64_t>(kWantedStages, room / (kWarps * row_bytes)));
    if (stages > 0) {
      const int unstaged = resident_blocks_per_sm(kernel, device, facts, fixed_smem);
      while (stages > 0 && resident_blocks_per_sm(kernel, device, facts, staged_smem(stages)) < unstaged) --stages;
    }
    if (stages == 0) return plan;
    plan.stages = stages;
    plan.smem = staged_smem(stages);
    const int64_t resident = std::max<int64_t>(
        1, static_cast<int64_t>(resident_blocks_per_sm(kernel, device, facts, plan.smem)) * facts.sms);
    if (blocks == 0) plan.grid = static_cast<unsigned>(std::min<int64_t>(plan.grid, resident));
  } else {
    (void)kernel, (void)device, (void)row_bytes, (void)max_staged_row_bytes;
  }
  return plan;
}

template StagedLaunch plan_staged_launch<true>(const void*, int, size_t, size_t, size_t, int64_t, int64_t);
template StagedLaunch plan_staged_launch<false>(const void*, int, size_t, size_t, size_t, int64_t, int64_t);

}  // namespace mt::ops::norm_detail
