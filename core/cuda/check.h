// Checkers for the CUDA runtime, cuBLAS/cuBLASLt and cuDNN. Every call into
// these libraries goes through one of them; a kernel launch is followed by
// MT_CUDA_CHECK_LAUNCH(). Include only from .cu files or files built with the
// CUDA toolkit's headers on the include path.
#pragma once

#include <cuda_runtime.h>

#include "core/vendor_check.h"

#define MT_CUDA_CHECK(expr)                                                                                 \
  do {                                                                                                      \
    const cudaError_t mt_status_ = (expr);                                                                  \
    if (mt_status_ != cudaSuccess) {                                                                        \
      ::mt::detail::throw_vendor_error("CUDA", static_cast<long>(mt_status_), cudaGetErrorName(mt_status_), \
                                       cudaGetErrorString(mt_status_), #expr, __FILE__, __LINE__);          \
    }                                                                                                       \
  } while (0)

#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())

// cuBLAS and cuBLASLt share cublasStatus_t; the names come from cuBLASLt (the library we link).
#define MT_CUBLAS_CHECK(expr)                                                                                      \
  do {                                                                                                             \
    const cublasStatus_t mt_status_ = (expr);                                                                      \
    if (mt_status_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
      ::mt::detail::throw_vendor_error("cuBLAS", static_cast<long>(mt_status_), cublasLtGetStatusName(mt_status_), \
                                       cublasLtGetStatusString(mt_status_), #expr, __FILE__, __LINE__);            \
    }                                                                                                              \
  } while (0)

#define MT_CUDNN_CHECK(expr)                                                                                    \
  do {                                                                                                          \
    const cudnnStatus_t mt_status_ = (expr);                                                                    \
    if (mt_status_ != CUDNN_STATUS_SUCCESS) {                                                                   \
      ::mt::detail::throw_vendor_error("cuDNN", static_cast<long>(mt_status_), cudnnGetErrorString(mt_status_), \
                                       cudnnGetErrorString(mt_status_), #expr, __FILE__, __LINE__);             \
    }                                                                                                           \
  } while (0)
