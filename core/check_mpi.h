// Checker for MPI calls (MPI_ERRORS_RETURN must be set on the communicator so
// errors come back as codes instead of aborting). Include after <mpi.h>.
#pragma once

#include <string>

#include "core/vendor_check.h"

namespace mt::detail {
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<size_t>(length));
}
}  // namespace mt::detail

#define MT_MPI_CHECK(expr)                                                                                         \
  do {                                                                                                             \
    const int mt_status_ = (expr);                                                                                 \
    if (mt_status_ != MPI_SUCCESS) {                                                                               \
      const std::string mt_text_ = ::mt::detail::mpi_error_text(mt_status_);                                       \
      ::mt::detail::throw_vendor_error("MPI", static_cast<long>(mt_status_), "MPI_ERR", mt_text_, #expr, __FILE__, \
                                       __LINE__);                                                                  \
    }                                                                                                              \
  } while (0)
