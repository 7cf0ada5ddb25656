// Internal: what the allocator saw while this thread captured a CUDA Graph (core/cuda/graph.cu
// checks it; core/cuda/context.cu fills it in allocate and deallocate).
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "core/cuda_context.h"

struct CUgraphNode_st;

namespace mt::cuda::internal {

struct CaptureLedger {
  struct DeferredFree {
    void* ptr;
    size_t nbytes;
    StreamHandle stream;
  };
  StreamHandle stream = nullptr;  // the capturing stream
  // False while an eager step is only observed (Graph::observe): then nothing is recorded,
  // frees of older memory still wait for the end of the step, and capturing() is false.
  bool capturing = true;
  std::unordered_map<void*, size_t> live;  // allocated during the capture and not yet freed: bytes
  // Memory made before the capture and released during it, on the capturing stream: a graph
  // may free only its own allocations, so these are freed after the capture has ended.
  std::vector<DeferredFree> deferred;
  // Free nodes captured on the capturing stream and kept out of its chain while dependent launch
  // is on (core/cuda/context.cu, "a captured stream's kernels kept adjacent"): each with the nodes
  // it followed. The next allocation is ordered after it (in a DependentLaunchScope, once the
  // stream has moved past those nodes), so that it may take the freed memory.
  struct AsideFree {
    CUgraphNode_st* node;
    std::vector<CUgraphNode_st*> after;
  };
  std::vector<AsideFree> aside_frees;
  size_t other_stream_allocations = 0;  // allocations on another stream (not captured)
  size_t host_copies = 0;               // copies from host memory while observing (a capture refuses them)
};

// The calling thread's ledger while it captures; null otherwise.
void set_capture_ledger(CaptureLedger* ledger);

// Frees what the capture deferred, on their streams (after whatever the caller enqueued).
void free_deferred(CaptureLedger& ledger);

// Addresses a failed (invalidated) capture handed out and the step kept: they were never
// backed by memory, so deallocate() forgets them instead of freeing them.
void poison(const CaptureLedger& ledger);

}  // namespace mt::cuda::internal
