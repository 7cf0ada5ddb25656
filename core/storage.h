// Storage: one allocation that tensors view. Views share a Storage and its
// version counter; an in-place write bumps the version, which is how saved
// tensors and the autocast cast cache notice that their data changed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "core/cuda_context.h"
#include "core/device.h"

namespace mt {

class Storage {
 public:
  // Allocates `nbytes` on `device`: 64-byte aligned host memory, or stream-ordered
  // device memory on the device's current stream.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  Storage(void* data, size_t nbytes, Device device, cuda::Stream stream)
      : data_(data), nbytes_(nbytes), device_(device), stream_(std::move(stream)) {}

  void* data_;
  size_t nbytes_;
  Device device_;
  cuda::Stream stream_;  // allocated on, and freed on (stream order); kept alive while the storage lives
  std::atomic<uint64_t> version_{0};
};

}  // namespace mt
