#include "core/storage.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace mt {

namespace {
constexpr size_t kHostAlignment = 64;  // a cache line; also enough for 16-byte vector loads
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    const size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* data = rounded ? std::aligned_alloc(kHostAlignment, rounded) : nullptr;
    MT_CHECK_T(OutOfMemoryError, rounded == 0 || data != nullptr, "out of host memory: tried to allocate ",
               cuda::format_bytes(nbytes));
    return std::shared_ptr<Storage>(new Storage(data, nbytes, device, cuda::Stream()));
  }
  cuda::Stream stream = cuda::current_stream(device.index);
  void* data = nbytes ? cuda::allocate(nbytes, device.index, stream.handle()) : nullptr;
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, stream));
}

Storage::~Storage() {
  if (data_ == nullptr) return;
  if (device_.is_cpu()) {
    std::free(data_);
    return;
  }
  try {
    cuda::deallocate(data_, nbytes_, device_.index, stream_.handle());
  } catch (...) {
    // A destructor must not throw; a failed free at teardown (driver shutting down) is not actionable.
  }
}

}  // namespace mt
