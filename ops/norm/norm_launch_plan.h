// Internal to ops/norm's CUDA files: how a warp-per-row kernel is launched, chosen on the host
// from the kernel's and the device's facts (norm_launch_plan.cu). Staging (the per-warp ring of
// row slots, norm_warp_rows.cuh) is taken only where it costs no resident blocks: as many stages
// as kWantedStages and the device's shared memory allow without fewer resident blocks per SM than
// the unstaged kernel has, and only for rows within the direction's byte limit. The grid depends
// on the rows (and `blocks`) and the occupancy alone, never on timing, so a launch of a given
// shape on a given device is always the same.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::ops::norm_detail {

// How a staged warp-per-row kernel is launched (RowStream): row slots per warp, dynamic shared
// memory per block, and blocks.
struct StagedLaunch {
  int stages = 0;   // 0: unstaged
  size_t smem = 0;  // bytes per block
  unsigned grid = 0;
};

// Row slots per warp the staged kernels ask for. Two keep the next row in flight while a warp
// works on one; three were slower: the larger rings leave fewer blocks resident.
constexpr int kWantedStages = 2;

// Rows of more bytes than the limits below (all streamed operands together) are not staged: their
// register loads already keep much in flight per warp, and the rings cost resident blocks. Where
// the balance tips differs between the directions (the backward gains from staging rows that the
// forward is faster without), hence a limit per direction.
constexpr size_t kMaxStagedForwardRowBytes = 4096;
constexpr size_t kMaxStagedBackwardRowBytes = 6144;

template <bool kStageable>
StagedLaunch plan_staged_launch(const void* kernel, int device, size_t fixed_smem, size_t row_bytes,
                                size_t max_staged_row_bytes, int64_t rows, int64_t blocks);

}  // namespace mt::ops::norm_detail
