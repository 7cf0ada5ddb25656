// FP8 GEMMs through cuBLASLt (compute capability 8.9 and later): descriptors, the cached
// heuristic choice, then the checked entry point.
//
// y [M, N] = a [M, K] b^T with both operands row-major, K-major. By Note [Row-major GEMMs through
// column-major cuBLASLt] (ops/matmul/matmul_cuda.cu) cuBLASLt computes y^T [N, M] = b a^T: its A
// is our b, which in column-major order is [K, N] with ld K, read transposed; its B is our a,
// column-major [K, M] with ld K, read as it is. That is the "TN" form, the only one the FP8
// kernels of Ada and Hopper take, with no copy. So cuBLASLt's A scale is our scale_inv_b, its B
// scale our scale_inv_a, and a bias over our columns is one over its rows (its BIAS epilogue).
//
// Numerics: CUBLAS_COMPUTE_32F with fast accumulation off (the default, set explicitly): the
// tensor cores' partial sums are promoted into f32 accumulators as the kernel goes, rather than
// kept in their narrower internal format for the whole of K.
//
// Scales: one per operand (fp8_gemm), or one per row of each operand (fp8_rowwise_gemm, the FP8
// frozen base): cuBLASLt's outer-vector mode (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), whose
// epilogue multiplies product (i, j) by its A vector's i-th and its B vector's j-th element; by the
// swap above its A vector, of its M = our N elements, is our scale_inv_b. cuBLAS's documentation
// asks for both operands' scale modes set to it. Both kinds share the runner below.
#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "ops/fp8/fp8_kernels.h"
#include "ops/fp8/fp8_rowwise_kernels.h"
#include "ops/matmul/cublaslt_descriptors.h"
#include "ops/matmul/matmul_kernels.h"

namespace mt::ops {

namespace {

using Desc = lt::MatmulDesc;
using lt::alignment_of;
using lt::Layout;
using lt::Preference;

cudaDataType_t lt_type(DType dtype) {
  if (dtype == DType::f8e4m3) return CUDA_R_8F_E4M3;
  if (dtype == DType::f8e5m2) return CUDA_R_8F_E5M2;
  return dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;  // the outputs fp8_gemm allows
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  return Layout(raw);
}

template <typename V>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const V& value) {
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

// The heuristic's first algorithm for a problem, cached for the process (found = false: none, or
// the combination refused, remembered so that the refusal is asked about once).
struct Choice {
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool found = false;
};
using Key = std::array<int64_t, 13>;

enum class Scales { per_tensor, per_row };

std::mutex& cache_mutex() {
  static auto* m = new std::mutex();  // never destroyed, like the cache
  return *m;
}
std::map<Key, Choice>& cache() {
  static auto* c = new std::map<Key, Choice>();
  return *c;
}

// Runs p through cuBLASLt, with the output amax written by the epilogue when with_amax (per-tensor
// scales only). Returns CUBLAS_STATUS_NOT_SUPPORTED, having run nothing, when the heuristic has no
// algorithm for it; a refusal at the heuristic or at the launch is remembered and not asked again.
cublasStatus_t run(const Fp8GemmProblem& p, bool with_amax, Scales scales) {
  const int device = p.out.device().index;
  const int64_t m = p.a.size(0), k = p.a.size(1), n = p.b.size(0);
  const cuda::Stream stream = cuda::current_stream(device);
  auto handle = static_cast<cublasLtHandle_t>(cublaslt_handle(device));

  cublasLtMatmulDesc_t raw_desc = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const Desc desc(raw_desc);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});
  if (scales == Scales::per_row) {
#if CUBLAS_VERSION >= 120900
    // A library that does not know the mode refuses the attribute: a refusal, as at the heuristic.
    const auto outer_vector = static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
    for (const auto attribute : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE}) {
      if (cublasLtMatmulDescSetAttribute(raw_desc, attribute, &outer_vector, sizeof(outer_vector)) !=
          CUBLAS_STATUS_SUCCESS) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
      }
    }
#else
    return CUBLAS_STATUS_NOT_SUPPORTED;  // outer-vector scales came with cuBLASLt 12.9
#endif
  }
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_inv_b.data_ptr());
  set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_inv_a.data_ptr());
  if (p.bias.defined()) {
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias.data_ptr());
    set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
  }
  if (with_amax) set_attribute(raw_desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p.amax.data_ptr());

  const cudaDataType_t out_type = lt_type(p.out.dtype());
  const Layout layout_a = make_layout(lt_type(p.b.dtype()), k, n, k);  // cuBLASLt's A: our b
  const Layout layout_b = make_layout(lt_type(p.a.dtype()), k, m, k);  // cuBLASLt's B: our a
  const Layout layout_d = make_layout(out_type, n, m, n);
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
                   p.bias.defined() ? alignment_of(p.bias.data_ptr()) : 0,
                   with_amax ? 1 : 0,
                   static_cast<int64_t>(scales)};
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
    const Preference pref = lt::make_preference(cublaslt_workspace_bytes(), align_a, align_b, align_d, align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, raw_desc, layout_a.get(), layout_b.get(), layout_d.get(), layout_d.get(),
                                       pref.get(), /*requestedAlgoCount=*/1, &result, &found);
    // A combination cuBLASLt does not serve comes back as NOT_SUPPORTED or as no result; an amax it
    // cannot compute for this output (then retried without it), or a scale mode this GPU or library
    // does not offer, may come back as INVALID_VALUE.
    const bool refused = status == CUBLAS_STATUS_NOT_SUPPORTED ||
                         ((with_amax || scales == Scales::per_row) && status == CUBLAS_STATUS_INVALID_VALUE);
    if (!refused) MT_CUBLAS_CHECK(status);
    choice.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (choice.found) {
      choice.algo = result.algo;
      choice.workspace = result.workspaceSize;
    }
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache().emplace(key, choice);
  }
  if (!choice.found) return CUBLAS_STATUS_NOT_SUPPORTED;
  MT_INTERNAL_ASSERT(choice.workspace <= cublaslt_workspace_bytes(), "fp8_gemm: the heuristic asked for ",
                     choice.workspace, " bytes of workspace");
  const float alpha = 1.0f, beta = 0.0f;
  void* d = p.out.data_ptr();
  const cublasStatus_t status =
      cublasLtMatmul(handle, raw_desc, &alpha, p.b.data_ptr(), layout_a.get(), p.a.data_ptr(), layout_b.get(), &beta, d,
                     layout_d.get(), d, layout_d.get(), &choice.algo, cublaslt_workspace(device),
                     cublaslt_workspace_bytes(), stream.handle());
  // An amax or a scale mode refused at the launch (before any work): not asked again.
  if (status == CUBLAS_STATUS_INVALID_VALUE && (with_amax || scales == Scales::per_row)) {
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache()[key].found = false;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return status;
}

}  // namespace

bool fp8_gemm_cuda(const Fp8GemmProblem& p) {
  const int device = p.out.device().index;
  cuda::DeviceGuard on_device(device);
  bool with_amax = p.amax.defined();
  if (with_amax) {
    MT_CUDA_CHECK(cudaMemsetAsync(p.amax.data_ptr(), 0, sizeof(float), cuda::current_stream(device).handle()));
  }
  cublasStatus_t status = run(p, with_amax, Scales::per_tensor);
  // cuBLASLt computes the output's amax only for some output types; where it refuses (at the
  // heuristic or at the launch), the GEMM runs without it and the caller reduces the output.
  if (with_amax && (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
    with_amax = false;
    status = run(p, with_amax, Scales::per_tensor);
  }
  MT_CHECK(status != CUBLAS_STATUS_NOT_SUPPORTED, "fp8_gemm: cuBLASLt has no FP8 algorithm for [", p.a.size(0), ", ",
           p.a.size(1), "] ", dtype_name(p.a.dtype()), " x [", p.b.size(0), ", ", p.b.size(1), "] ",
           dtype_name(p.b.dtype()), "^T -> ", dtype_name(p.out.dtype()), " on ", p.out.device().str());
  MT_CUBLAS_CHECK(status);
  return with_amax;
}

bool fp8_rowwise_gemm_cuda(const Fp8RowwiseGemmProblem& p) {
  cuda::DeviceGuard on_device(p.out.device().index);
  Fp8GemmProblem problem;
  problem.a = p.a;
  problem.b = p.b;
  problem.scale_inv_a = p.scale_inv_a;
  problem.scale_inv_b = p.scale_inv_b;
  problem.out = p.out;
  problem.bias = p.bias;
  const cublasStatus_t status = run(problem, /*with_amax=*/false, Scales::per_row);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  MT_CUBLAS_CHECK(status);
  return true;
}

}  // namespace mt::ops
