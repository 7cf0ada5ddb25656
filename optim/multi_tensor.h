// Internal: the host side of multi-tensor apply (optim/multi_tensor.cuh), in
// plain C++ so that the launch planning is unit-tested on the CPU.
//
// One launch gets a TensorListMetadata by value (kernel parameter space, no copy
// to device memory): up to kMaxTensors tensors (their addresses in each of
// `Depth` parallel lists, e.g. {param, grad, exp_avg, exp_avg_sq}, and their
// sizes) and a map from each of up to kMaxBlocks blocks to (tensor, chunk). A
// block handles `chunk_size` consecutive elements of one tensor. When either
// table fills, the planner launches and starts a new one; a tensor cut by a full
// block table carries on in the next launch. Blocks are numbered across all the
// launches of one apply (MultiTensorBlock::index), so an op can write one
// partial result per block into a buffer of multi_tensor_block_count() entries.
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/macros.h"
#include "core/tensor.h"

namespace mt::optim_kernels {

struct MultiTensorConfig {
  // Elements one block handles: a tensor of n elements takes ceil(n / chunk_size) blocks.
  int64_t chunk_size = 65536;
  // Per launch at most this many tensors and blocks (clamped to the capacity of
  // TensorListMetadata); more start another launch. Tests shrink them.
  int max_tensors = INT_MAX;
  int max_blocks = INT_MAX;
};

// Table sizes per depth (PyTorch's): the metadata stays under the 4 KiB kernel
// parameter limit with room left for the op's own fields.
template <int Depth>
struct MultiTensorCapacity;
template <>
struct MultiTensorCapacity<1> {
  static constexpr int tensors = 110, blocks = 320;
};
template <>
struct MultiTensorCapacity<2> {
  static constexpr int tensors = 64, blocks = 320;
};
template <>
struct MultiTensorCapacity<3> {
  static constexpr int tensors = 48, blocks = 320;
};
template <>
struct MultiTensorCapacity<4> {
  static constexpr int tensors = 36, blocks = 320;
};
template <>
struct MultiTensorCapacity<5> {
  static constexpr int tensors = 30, blocks = 320;
};
template <>
struct MultiTensorCapacity<6> {
  static constexpr int tensors = 24, blocks = 320;
};

template <int Depth>
struct TensorListMetadata {
  static constexpr int kMaxTensors = MultiTensorCapacity<Depth>::tensors;
  static constexpr int kMaxBlocks = MultiTensorCapacity<Depth>::blocks;
  void* addresses[Depth][kMaxTensors];        // first element of tensor slot t in list d
  int64_t numel[kMaxTensors];                 // elements of tensor slot t
  unsigned char block_to_tensor[kMaxBlocks];  // block -> its tensor's slot in this launch
  int block_to_chunk[kMaxBlocks];             // block -> its chunk of that tensor
  int64_t chunk_size;
  int64_t first_block;  // blocks launched before this launch by the same apply
};
static_assert(TensorListMetadata<1>::kMaxTensors <= 256, "block_to_tensor holds a tensor slot in one byte");
static_assert(sizeof(TensorListMetadata<1>) <= 3584 && sizeof(TensorListMetadata<2>) <= 3584 &&
                  sizeof(TensorListMetadata<3>) <= 3584 && sizeof(TensorListMetadata<4>) <= 3584 &&
                  sizeof(TensorListMetadata<5>) <= 3584 && sizeof(TensorListMetadata<6>) <= 3584,
              "the metadata must leave at least 512 bytes of the 4 KiB kernel parameters to the op");

// What one block works on: elements [begin, end) of one tensor, in each list.
template <int Depth>
struct MultiTensorBlock {
  void* ptr[Depth];  // the tensor's first element (not the chunk's), in list d
  int64_t begin, end;
  int64_t index;  // this block's number among all blocks of the apply
};

// Block b of a launch (the kernel calls it with blockIdx.x).
template <int Depth>
MT_HOST_DEVICE inline MultiTensorBlock<Depth> multi_tensor_block(const TensorListMetadata<Depth>& meta, int b) {
  const int t = meta.block_to_tensor[b];
  MultiTensorBlock<Depth> block;
  for (int d = 0; d < Depth; ++d) block.ptr[d] = meta.addresses[d][t];
  block.begin = static_cast<int64_t>(meta.block_to_chunk[b]) * meta.chunk_size;
  block.end = block.begin + meta.chunk_size < meta.numel[t] ? block.begin + meta.chunk_size : meta.numel[t];
  block.index = meta.first_block + b;
  return block;
}

// Blocks an apply over tensors of these sizes launches in all.
inline int64_t multi_tensor_block_count(const std::vector<int64_t>& numels, int64_t chunk_size) {
  int64_t blocks = 0;
  for (const int64_t n : numels) blocks += (n + chunk_size - 1) / chunk_size;
  return blocks;
}

// Fills the tables for `tensors` (slot i = the Depth tensors of one parameter;
// equal sizes, or one element for a per-slot scalar; empty ones skipped) and calls launch(meta, blocks) for each
// launch.
template <int Depth, typename Launch>
void plan_multi_tensor_launches(const std::vector<std::array<Tensor, Depth>>& tensors, const MultiTensorConfig& config,
                                Launch&& launch) {
  using Meta = TensorListMetadata<Depth>;
  const int64_t chunk = config.chunk_size;
  MT_INTERNAL_ASSERT(chunk > 0, "multi-tensor apply: chunk_size must be positive, got ", chunk);
  const int max_tensors = std::clamp(config.max_tensors, 1, Meta::kMaxTensors);
  const int max_blocks = std::clamp(config.max_blocks, 1, Meta::kMaxBlocks);

  Meta meta{};
  meta.chunk_size = chunk;
  meta.first_block = 0;
  int tensors_here = 0;  // slots filled in this launch's table
  int blocks_here = 0;   // blocks mapped in this launch's table
  const auto flush = [&] {
    launch(static_cast<const Meta&>(meta), blocks_here);
    meta.first_block += blocks_here;
    blocks_here = 0;
  };

  for (const std::array<Tensor, Depth>& slot : tensors) {
    const int64_t n = slot[0].numel();
    // A list of one-element tensors carries a per-slot scalar (an optimizer's step
    // count): the op reads it through block.ptr[d] and never indexes it.
    for (int d = 1; d < Depth; ++d) {
      MT_INTERNAL_ASSERT(slot[d].numel() == n || slot[d].numel() == 1, "multi-tensor apply: list ", d, " holds ",
                         slot[d].numel(), " elements where list 0 holds ", n);
    }
    if (n == 0) continue;
    const int64_t chunks = (n + chunk - 1) / chunk;
    MT_INTERNAL_ASSERT(chunks <= INT_MAX, "multi-tensor apply: ", chunks, " chunks of ", chunk, " elements");
    for (int d = 0; d < Depth; ++d) meta.addresses[d][tensors_here] = slot[d].data_ptr();
    meta.numel[tensors_here] = n;
    ++tensors_here;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_to_tensor[blocks_here] = static_cast<unsigned char>(tensors_here - 1);
      meta.block_to_chunk[blocks_here] = static_cast<int>(c);
      ++blocks_here;
      if (blocks_here == max_blocks) {
        flush();
        if (c + 1 < chunks) {  // the tensor goes on in the next launch, as its slot 0
          for (int d = 0; d < Depth; ++d) meta.addresses[d][0] = meta.addresses[d][tensors_here - 1];
          meta.numel[0] = meta.numel[tensors_here - 1];
          tensors_here = 1;
        } else {
          tensors_here = 0;
        }
      }
    }
    if (tensors_here == max_tensors) {
      if (blocks_here > 0) flush();
      tensors_here = 0;
    }
  }
  if (blocks_here > 0) flush();
}

}  // namespace mt::optim_kernels
