// Checker for NCCL calls. Include from files that include <nccl.h>.
#pragma once

#include "core/vendor_check.h"

#define MT_NCCL_CHECK(expr)                                                                                   \
  do {                                                                                                        \
    const ncclResult_t mt_status_ = (expr);                                                                   \
    if (mt_status_ != ncclSuccess && mt_status_ != ncclInProgress) {                                          \
      ::mt::detail::throw_vendor_error("NCCL", static_cast<long>(mt_status_), ncclGetErrorString(mt_status_), \
                                       ncclGetLastError(nullptr), #expr, __FILE__, __LINE__);                 \
    }                                                                                                         \
  } while (0)
