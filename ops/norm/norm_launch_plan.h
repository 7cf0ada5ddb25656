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
// works on one; on an H200 three were slower (op_bench layer_norm 0.061 against 0.057 ms: the
// larger rings leave fewer blocks resident).
constexpr int kWantedStages = 2;

// Rows of more bytes than the limits below (all streamed operands together) are not staged: their
// register loads already keep much in flight per warp, and the rings cost resident blocks.
// op_bench on an H200: the bf16 layer_norm's 1.5 + 3 KiB rows went from 0.056 to 0.051 ms staged,
// add_layer_norm's f32-stream 4.5 + 7.5 KiB rows from 0.105 to 0.111 ms. Later, in turns within one
// process: the f32 layer_norm with its backward's 6 KiB rows staged 73.1-73.5% of the copy
// bandwidth against 66.3-66.5%, add_layer_norm with its forward's 4.5 KiB rows staged 88.0-88.1%
// against 89.6-89.7%. Hence a limit per direction.
constexpr size_t kMaxStagedForwardRowBytes = 4096;
constexpr size_t kMaxStagedBackwardRowBytes = 6144;

template <bool kStageable>
StagedLaunch plan_staged_launch(const void* kernel, int device, size_t fixed_smem, size_t row_bytes,
                                size_t max_staged_row_bytes, int64_t rows, int64_t blocks);

}  // namespace mt::ops::norm_detail
