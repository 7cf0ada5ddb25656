// Internal: cuBLASLt's descriptors as owning handles, for the files that call cuBLASLt (the
// matmul family and the FP8 GEMM). CUDA builds only.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "core/cuda/check.h"

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

// The largest power of two (up to 256) that p's address is a multiple of.
inline uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 1;
  while (alignment < 256 && address % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

// A heuristic query's preferences: at most `workspace` bytes, and the operands' alignments in bytes
// (the default assumes 256-byte aligned matrices; a view at an offset may be less aligned).
inline Preference make_preference(uint64_t workspace, uint32_t align_a, uint32_t align_b, uint32_t align_c,
                                  uint32_t align_d) {
  cublasLtMatmulPreference_t raw = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw));
  Preference pref(raw);
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                       sizeof(workspace)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attribute, bytes] : alignments) {
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, attribute, &bytes, sizeof(bytes)));
  }
  return pref;
}

}  // namespace mt::ops::lt
