// Internal: cuBLASLt's descriptors as owning handles, for the files that call cuBLASLt (the
// matmul family and the FP8 GEMM). CUDA builds only.
#pragma once

#include <cublasLt.h>

#include <memory>
#include <type_traits>

namespace mt::ops::lt {

struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t p) const { cublasLtMatrixLayoutDestroy(p); }
};
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t p) const { cublasLtMatmulDescDestroy(p); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;
using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

}  // namespace mt::ops::lt
