// What every cuDNN caller in ops/ shares: one handle per device, bound to the
// current stream for the duration of a call, and stream-ordered scratch memory.
// Include from CUDA builds only (.cu files, or .cpp files guarded by MT_WITH_CUDA).
#pragma once

#include <cudnn.h>

#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "core/tensor.h"

namespace mt::ops {

// One handle per device, created on first use. Never destroyed: a handle torn
// down during static destruction could outlive the CUDA context.
struct CudnnHandleSlot {
  std::once_flag created;
  cudnnHandle_t handle = nullptr;
  std::mutex in_use;  // cudnnSetStream + the call must not interleave across threads
};

inline CudnnHandleSlot& cudnn_handle_slot(int device) {
  static const int count = cuda::device_count();
  static CudnnHandleSlot* slots = new CudnnHandleSlot[static_cast<size_t>(count > 0 ? count : 1)];
  MT_INTERNAL_ASSERT(device >= 0 && device < count, "cuda:", device, " of ", count);
  return slots[device];
}

// The device's handle, bound to its current stream and held for the scope.
// Construct it after the DeviceGuard: the handle is created on the current device.
class CudnnHandle {
 public:
  explicit CudnnHandle(int device) : slot_(cudnn_handle_slot(device)), lock_(slot_.in_use) {
    std::call_once(slot_.created, [this] { MT_CUDNN_CHECK(cudnnCreate(&slot_.handle)); });
    MT_CUDNN_CHECK(cudnnSetStream(slot_.handle, cuda::current_stream(device).handle()));
  }
  cudnnHandle_t get() const { return slot_.handle; }

 private:
  CudnnHandleSlot& slot_;
  std::lock_guard<std::mutex> lock_;
};

// Scratch memory for one cuDNN call, from the stream-ordered pool (freed on the
// same stream once the call's work is queued).
class CudnnWorkspace {
 public:
  CudnnWorkspace(size_t bytes, Device device)
      : buffer_(bytes ? empty({static_cast<int64_t>(bytes)}, TensorOptions().dtype(DType::u8).device(device))
                      : Tensor()),
        bytes_(bytes) {}
  void* data() const { return bytes_ ? buffer_.data_ptr() : nullptr; }
  size_t bytes() const { return bytes_; }

 private:
  Tensor buffer_;
  size_t bytes_;
};

}  // namespace mt::ops
