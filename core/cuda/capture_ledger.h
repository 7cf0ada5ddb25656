// Internal: what the allocator saw while this thread captured a CUDA Graph (core/cuda/graph.cu
// checks it; core/cuda/context.cu fills it in allocate and deallocate).
#pragma once

#include <cstddef>
#include <unordered_map>

#include "core/cuda_context.h"

namespace mt::cuda::internal {

struct CaptureLedger {
  StreamHandle stream = nullptr;                // the capturing stream
  std::unordered_map<void*, size_t> live;       // allocated during the capture and not yet freed: bytes
  size_t foreign_frees = 0, foreign_bytes = 0;  // frees of memory allocated before the capture
  size_t other_stream_allocations = 0;          // allocations on another stream (not captured)
  size_t failed_frees = 0;                      // refused by an invalidated capture
};

// The calling thread's ledger while it captures; null otherwise.
void set_capture_ledger(CaptureLedger* ledger);

}  // namespace mt::cuda::internal
