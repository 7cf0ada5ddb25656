// FP8 GEMMs with one scale per row of each operand, through cuBLASLt's outer-vector scaling
// (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F): the epilogue multiplies product (i, j) by
// scale_inv_a[i] * scale_inv_b[j], which is what a per-token x against a per-channel weight needs,
// at no cost beyond the GEMM's.
//
// The layout is fp8_gemm's (fp8_gemm_cuda.cu): y [M, N] = a b^T is computed as cuBLASLt's
// y^T [N, M] = b a^T in the TN form, so cuBLASLt's A is our b and its A scale vector, of cuBLASLt's
// M = our N elements, is scale_inv_b; its B vector (our M elements) is scale_inv_a. cuBLAS's
// documentation asks for both A's and B's scale mode set to the outer vector, and for no other
// mode changed. Fast accumulation stays off, as in fp8_gemm.
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "ops/fp8/fp8_rowwise_kernels.h"
#include "ops/matmul/cublaslt_descriptors.h"
#include "ops/matmul/matmul_kernels.h"

namespace mt::ops {

namespace {

cudaDataType_t lt_type(DType dtype) {
  if (dtype == DType::f8e4m3) return CUDA_R_8F_E4M3;
  if (dtype == DType::f8e5m2) return CUDA_R_8F_E5M2;
  return dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;  // the outputs fp8_rowwise_gemm allows
}

uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 1;
  while (alignment < 256 && address % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

lt::Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  return lt::Layout(raw);
}

template <typename V>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const V& value) {
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

// The heuristic's first algorithm for a problem, cached for the process; found = false records a
// refusal, so that it is asked about once.
struct Choice {
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool found = false;
};
using Key = std::array<int64_t, 11>;

std::mutex& cache_mutex() {
  static auto* m = new std::mutex();  // never destroyed, like the cache
  return *m;
}
std::map<Key, Choice>& cache() {
  static auto* c = new std::map<Key, Choice>();
  return *c;
}

void remember(const Key& key, const Choice& choice) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  cache()[key] = choice;
}

}  // namespace

bool fp8_rowwise_gemm_cuda(const Fp8RowwiseGemmProblem& p) {
  const int device = p.out.device().index;
  cuda::DeviceGuard on_device(device);
  const int64_t m = p.a.size(0), k = p.a.size(1), n = p.b.size(0);
  const cuda::Stream stream = cuda::current_stream(device);
  auto handle = static_cast<cublasLtHandle_t>(cublaslt_handle(device));

  cublasLtMatmulDesc_t raw_desc = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const lt::MatmulDesc desc(raw_desc);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});
  const auto outer_vector = static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer_vector);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer_vector);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_inv_b.data_ptr());  // [N]: cuBLASLt's M
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_inv_a.data_ptr());  // [M]: cuBLASLt's N
  if (p.bias.defined()) {
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias.data_ptr());
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
  }

  const cudaDataType_t out_type = lt_type(p.out.dtype());
  const lt::Layout layout_a = make_layout(lt_type(p.b.dtype()), k, n, k);  // cuBLASLt's A: our b
  const lt::Layout layout_b = make_layout(lt_type(p.a.dtype()), k, m, k);  // cuBLASLt's B: our a
  const lt::Layout layout_d = make_layout(out_type, n, m, n);
  const uint32_t align_a = alignment_of(p.b.data_ptr()), align_b = alignment_of(p.a.data_ptr()),
                 align_d = alignment_of(p.out.data_ptr());
  const Key key = {device,
                   m,
                   n,
                   k,
                   static_cast<int64_t>(p.a.dtype()),
                   static_cast<int64_t>(p.b.dtype()),
                   static_cast<int64_t>(out_type),
                   align_a,
                   align_b,
                   align_d,
                   p.bias.defined() ? alignment_of(p.bias.data_ptr()) : 0};
  Choice choice;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = cache().find(key);
    if (it != cache().end()) {
      choice = it->second;
      cached = true;
    }
  }
  if (!cached) {
    cublasLtMatmulPreference_t raw_pref = nullptr;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
    const lt::Preference pref(raw_pref);
    const uint64_t max_workspace = cublaslt_workspace_bytes();
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &max_workspace, sizeof(max_workspace)));
    const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> alignments = {
        {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}}};
    for (const auto& [attribute, bytes] : alignments) {
      MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, attribute, &bytes, sizeof(bytes)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, raw_desc, layout_a.get(), layout_b.get(), layout_d.get(), layout_d.get(),
                                       raw_pref, /*requestedAlgoCount=*/1, &result, &found);
    // A scale mode this GPU or library does not serve comes back as NOT_SUPPORTED, INVALID_VALUE or
    // no result: a refusal, not an error.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE) MT_CUBLAS_CHECK(status);
    choice.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (choice.found) {
      choice.algo = result.algo;
      choice.workspace = result.workspaceSize;
    }
    remember(key, choice);
  }
  if (!choice.found) return false;
  MT_INTERNAL_ASSERT(choice.workspace <= cublaslt_workspace_bytes(), "fp8_rowwise_gemm: the heuristic asked for ",
                     choice.workspace, " bytes of workspace");
  const float alpha = 1.0f, beta = 0.0f;
  void* d = p.out.data_ptr();
  const cublasStatus_t status =
      cublasLtMatmul(handle, raw_desc, &alpha, p.b.data_ptr(), layout_a.get(), p.a.data_ptr(), layout_b.get(), &beta, d,
                     layout_d.get(), d, layout_d.get(), &choice.algo, cublaslt_workspace(device),
                     cublaslt_workspace_bytes(), stream.handle());
  // cuBLASLt refuses a scale mode it cannot apply at the launch with INVALID_VALUE, before any work.
  if (status == CUBLAS_STATUS_INVALID_VALUE) {
    remember(key, Choice{});
    return false;
  }
  MT_CUBLAS_CHECK(status);
  return true;
}

}  // namespace mt::ops
