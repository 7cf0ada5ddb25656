// The common half of every vendor-library checker (CUDA, cuBLAS/cuBLASLt,
// cuDNN, NCCL, MPI): each library's macro (core/cuda/check.h, core/check_nccl.h,
// core/check_mpi.h) records the failing expression, file:line and the library's
// own error name and text, and throws VendorError (or a subtype) through here.
#pragma once

#include <string>

namespace mt::detail {

[[noreturn]] void throw_vendor_error(const char* library, long code, const std::string& name,
                                     const std::string& description, const char* expr, const char* file, int line);

}  // namespace mt::detail
