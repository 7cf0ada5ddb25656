#include "core/vendor_check.h"

#include "core/error.h"

namespace mt::detail {

void throw_vendor_error(const char* library, long code, const std::string& name, const std::string& description,
                        const char* expr, const char* file, int line) {
  const std::string message =
      str_cat(library, " error ", name, " (", code, "): ", description, "\n  in ", expr, "\n  at ", file, ":", line);
  if (name == "cudaErrorMemoryAllocation" || name == "CUBLAS_STATUS_ALLOC_FAILED" ||
      name == "CUDNN_STATUS_ALLOC_FAILED") {
    throw OutOfMemoryError(message);
  }
  throw VendorError(message);
}

}  // namespace mt::detail
