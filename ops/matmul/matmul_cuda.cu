// CUDA GEMMs through cuBLASLt. No kernels of our own: the per-device state
// (handle, heuristic cache, workspaces) first, then the checked entry point.
//
// Numerics: f32/f16/bf16 inputs use CUBLAS_COMPUTE_32F (fp32 accumulation,
// f32 scale type). That is not the _FAST_TF32 variant, so f32 GEMMs keep full
// f32 precision; TF32 becomes an explicit switch later (DESIGN.md section 4).
// f64 uses CUBLAS_COMPUTE_64F with an f64 scale type.
//
// Note [Row-major GEMMs through column-major cuBLASLt]
// Our matrices are row-major; cuBLASLt's default order is column-major. A
// row-major [R, C] matrix with leading dimension ld is, byte for byte, the
// column-major [C, R] matrix with the same ld: its transpose. So C = A B is
// computed as C^T = B^T A^T: cuBLASLt's "A" slot takes our b, its "B" slot our
// a, with m = N and n = M, and C^T lands in our row-major C untouched. We use
// this swap rather than CUBLASLT_ORDER_ROW because the column order is the one
// every cuBLASLt algorithm supports (the row order narrows the heuristic's
// choices, and FP8 kernels require column-major A and B), and because a
// transposed operand then costs nothing: it is the same memory read with the
// other CUBLAS_OP.
#include <cublasLt.h>

#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/backends.h"
#include "ops/common.h"
#include "ops/matmul/cublaslt_descriptors.h"
#include "ops/matmul/matmul_kernels.h"

namespace mt::ops {

namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // 32 MiB, as llm.c and PyTorch on Hopper
constexpr size_t kWorkspaceAlignment = 256;           // cuBLASLt wants a 256-byte aligned workspace

// Handle creation and the heuristic read the current device's properties: they
// run under cuda::DeviceGuard.
using cuda::DeviceGuard;

using lt::alignment_of;
using lt::Layout;
using lt::MatmulDesc;
using lt::Preference;

template <typename T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, Half>) return CUDA_R_16F;
  return CUDA_R_16BF;  // BFloat16 (dispatch_floating allows nothing else)
}

// One operand as cuBLASLt sees it (Note [Row-major GEMMs through column-major cuBLASLt]).
struct LtOperand {
  const void* data = nullptr;
  cublasOperation_t op = CUBLAS_OP_N;
  uint64_t rows = 0, cols = 0;  // of the stored column-major matrix
  int64_t ld = 1;
  int64_t batch_stride = 0;
  uint32_t alignment = 1;  // bytes; the largest power of two (<= 256) dividing the address
};

// Our [rows, cols] operand, read in column-major order: a row-major matrix is
// stored as its transpose (op N yields op(x)^T = x^T, what C^T = B^T A^T needs);
// a column-major one is stored as itself and read with op T.
LtOperand lt_operand(const MatrixOperand& x) {
  LtOperand o;
  o.data = x.tensor.data_ptr();
  const bool row = x.order == Order::row_major;
  o.op = row ? CUBLAS_OP_N : CUBLAS_OP_T;
  o.rows = static_cast<uint64_t>(row ? x.cols : x.rows);
  o.cols = static_cast<uint64_t>(row ? x.rows : x.cols);
  o.ld = x.ld;
  o.batch_stride = x.batch_stride;
  o.alignment = alignment_of(o.data);
  return o;
}

Layout make_layout(cudaDataType_t type, const LtOperand& x, int32_t batch) {
  cublasLtMatrixLayout_t raw = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, x.rows, x.cols, x.ld));
  Layout layout(raw);
  if (batch > 1) {
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &x.batch_stride,
                                                     sizeof(x.batch_stride)));
  }
  return layout;
}

// ---- per-device state ----

struct DeviceState {
  std::once_flag init;
  cublasLtHandle_t handle = nullptr;
};

// One handle per device, created on first use. Never destroyed: tearing cuBLASLt
// down in a static destructor can race the CUDA runtime's own shutdown.
cublasLtHandle_t handle_for(int device) {
  static auto* states = new DeviceState[kMaxDevices];
  MT_INTERNAL_ASSERT(device >= 0 && device < kMaxDevices, "matmul: device index ", device, " out of range");
  DeviceState& s = states[device];
  std::call_once(s.init, [&] {
    DeviceGuard guard(device);
    MT_CUBLAS_CHECK(cublasLtCreate(&s.handle));
  });
  return s.handle;
}

// The 32 MiB workspace of (device, stream), allocated from the stream-ordered
// pool on that stream at first use and kept for the process. One per stream,
// not one per device: GEMMs running concurrently on two streams of a device
// would otherwise scribble over the same scratch memory.
void* workspace_for(int device, const cuda::Stream& stream) {
  static auto* mutex = new std::mutex();  // never destroyed, like the map it guards
  static auto* spaces = new std::map<std::pair<int, cuda::StreamHandle>, Tensor>();
  std::lock_guard<std::mutex> lock(*mutex);
  const auto key = std::make_pair(device, stream.handle());
  auto it = spaces->find(key);
  if (it == spaces->end()) {
    // mt::empty allocates on current_stream(device), the stream this workspace serves.
    Tensor buffer = empty({static_cast<int64_t>(kWorkspaceBytes + kWorkspaceAlignment)},
                          TensorOptions().dtype(DType::u8).device(cuda_device(device)));
    it = spaces->emplace(key, std::move(buffer)).first;
  }
  const auto address = reinterpret_cast<uintptr_t>(it->second.data_ptr());
  return reinterpret_cast<void*>((address + kWorkspaceAlignment - 1) & ~uintptr_t{kWorkspaceAlignment - 1});
}

// Heuristic results, cached per problem: everything the descriptors and the
// preference describe (device, dtype, batch, sizes, ops, leading dims, batch
// strides, alignments, the epilogue and its vectors' and matrix's alignments), and
// whether the choice is to be timed (a tuned choice is not served once repeatable
// results are asked for, nor the heuristic's first once tuning is on).
using AlgoKey = std::array<int64_t, 23>;

struct AlgoChoice {
  cublasLtMatmulAlgo_t algo;
  size_t workspace_bytes;
  bool available;  // false: the heuristic had nothing for this epilogue (asked once, remembered)
};

std::mutex& algo_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<AlgoKey, AlgoChoice>& algo_cache() {
  static auto* cache = new std::map<AlgoKey, AlgoChoice>();  // never destroyed
  return *cache;
}

std::string describe_problem(const GemmProblem& p) {
  return detail::str_cat(p.batch, " x [", p.m, ", ", p.k, "] @ [", p.k, ", ", p.n, "] in ",
                         dtype_name(p.c.tensor.dtype()), " on ", p.c.tensor.device().str());
}

// Autotuning (backends::set_matmul_autotune): the heuristic's first kAutotuneCandidates
// algorithms, each run once untimed and then kAutotuneRuns times between two events; the fastest
// total wins. The heuristic ranks the algorithms by a model of the kernels, not by running them.
constexpr int kAutotuneCandidates = 8;
constexpr int kAutotuneRuns = 3;

// `run(algo)` launches the problem with that algorithm on `stream`, returning cuBLASLt's status;
// returns the index of the fastest of results[0, found) that ran every time, or 0 (the
// heuristic's first, which the caller's own launch then checks) when none did.
template <typename Run>
int fastest_algorithm(const cublasLtMatmulHeuristicResult_t* results, int found, int device, const cuda::Stream& stream,
                      Run&& run) {
  cuda::Event start(device, cuda::Event::Timing::enabled), stop(device, cuda::Event::Timing::enabled);
  int best = -1;
  float best_ms = 0;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    bool ran = run(results[i].algo) == CUBLAS_STATUS_SUCCESS;  // untimed: the first launch's setup
    start.record(stream);
    for (int r = 0; r < kAutotuneRuns && ran; ++r) ran = run(results[i].algo) == CUBLAS_STATUS_SUCCESS;
    stop.record(stream);
    if (!ran) continue;  // unusable here: not a candidate
    stop.synchronize();
    const float ms = start.elapsed_ms(stop);
    if (best < 0 || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  return best < 0 ? 0 : best;
}

// Times results[0, found) on the problem's own operands and returns the fastest's index. Every
// run writes C and the epilogue's outputs, which the chosen algorithm's run then overwrites; only
// an accumulating GEMM (beta != 0) would see the extra runs, so those write a scratch matrix of
// C's extent instead.
template <typename Scale>
int autotune_problem(const GemmProblem& p, const cublasLtMatmulHeuristicResult_t* results, int found,
                     cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t layout_a,
                     cublasLtMatrixLayout_t layout_b, cublasLtMatrixLayout_t layout_c, const LtOperand& lt_a,
                     const LtOperand& lt_b, const LtOperand& lt_c, int device, const cuda::Stream& stream) {
  const Scale alpha = static_cast<Scale>(p.alpha), beta = static_cast<Scale>(p.beta);
  Tensor scratch;
  void* c = p.c.tensor.data_ptr();
  if (p.beta != 0) {
    const int64_t extent = (p.batch - 1) * lt_c.batch_stride + static_cast<int64_t>(lt_c.cols - 1) * lt_c.ld +
                           static_cast<int64_t>(lt_c.rows);
    scratch = empty({extent}, TensorOptions().dtype(p.c.tensor.dtype()).device(p.c.tensor.device()));
    c = scratch.data_ptr();
  }
  void* workspace = workspace_for(device, stream);
  return fastest_algorithm(results, found, device, stream, [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle, desc, &alpha, lt_a.data, layout_a, lt_b.data, layout_b, &beta, c, layout_c, c,
                          layout_c, &algo, workspace, kWorkspaceBytes, stream.handle());
  });
}

// Returns false, having run nothing, when an optional epilogue (the GELU with its
// pre-activation, or the GELU's derivative at one) was asked for and no algorithm has it.
template <typename T>
bool gemm_typed(const GemmProblem& p) {
  constexpr bool f64 = std::is_same_v<T, double>;
  using Scale = std::conditional_t<f64, double, float>;
  constexpr cudaDataType_t type = cuda_type<T>();
  constexpr cudaDataType_t scale_type = f64 ? CUDA_R_64F : CUDA_R_32F;
  // TF32 only for f32 inputs, and only when the user asked (ops/backends.h).
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F
                                      : (std::is_same_v<T, float> && backends::allow_tf32_matmul())
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;

  const int device = p.c.tensor.device().index;
  MT_CHECK(p.batch <= INT32_MAX, "matmul: a batch of ", p.batch, " matrices exceeds cuBLASLt's limit of ", INT32_MAX,
           " (", describe_problem(p), ")");
  const auto batch = static_cast<int32_t>(p.batch);
  DeviceGuard guard(device);
  const cuda::Stream stream = cuda::current_stream(device);
  cublasLtHandle_t handle = handle_for(device);

  // C^T [N, M] = B^T [N, K] A^T [K, M]: cuBLASLt's A is our b, its B our a.
  const LtOperand lt_a = lt_operand(p.b), lt_b = lt_operand(p.a), lt_c = lt_operand(p.c);
  MT_INTERNAL_ASSERT(lt_c.op == CUBLAS_OP_N, "matmul: the output must be row-major");

  cublasLtMatmulDesc_t raw_desc = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, compute, scale_type));
  const MatmulDesc desc(raw_desc);
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, &lt_a.op, sizeof(lt_a.op)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, &lt_b.op, sizeof(lt_b.op)));
  // The epilogue cuBLASLt applies as it stores the tile, with the bias vector and the GELU
  // input matrix (the aux pointer) it reads or writes: each defined only for the epilogues
  // that take it.
  const Tensor& bias = p.epilogue.bias_vector();
  const Tensor& gelu_matrix = p.epilogue.pre_activation();
  const int64_t aux_ld = p.n;
  // The GELU input matrix is cuBLASLt's aux operand (GELU_AUX_BIAS writes it, DGELU reads it): its
  // ld must be a multiple of 8 (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD), and gemm() hands
  // us only single, 16-byte aligned f16/bf16 ones.
  const auto check_gelu_matrix = [&](const char* epilogue_name) {
    MT_INTERNAL_ASSERT(p.batch == 1 && !f64 && aux_ld % 8 == 0 && alignment_of(gelu_matrix.data_ptr()) >= 16,
                       "matmul: the ", epilogue_name, " epilogue cannot take this pre-activation (ld ", aux_ld,
                       ") for ", describe_problem(p));
  };
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (p.epilogue.kind()) {
    case Epilogue::none:
      break;
    case Epilogue::bias:
      // A bias over our columns is, in the swapped problem, a bias over cuBLASLt's rows:
      // exactly what its BIAS epilogue adds (one vector for every batch entry).
      epilogue = CUBLASLT_EPILOGUE_BIAS;
      break;
    case Epilogue::bias_gelu:
      // The GELU's input matrix, our row-major [M, N], is cuBLASLt's column-major [N, M] with
      // ld N, like C^T: GELU_AUX_BIAS writes it (the f32 accumulator plus bias, rounded to C's
      // dtype, the aux type's default) and GELU(it) to C. Its ld must be a multiple of 8 and
      // at least cuBLASLt's row count N.
      // cuBLASLt's GELU is the tanh form (GPT-2's, fn::GeluTanh); the op contract's CUDA cases
      // for linear_gelu compare the two.
      check_gelu_matrix("GELU");
      epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      break;
    case Epilogue::gelu_backward:
      // The GELU's backward: DGELU reads the GELU's input (the matrix GELU_AUX_BIAS wrote, in
      // the same layout and dtype) through the same aux pointer and ld, and writes
      // C = (A B) * GELU'(aux). That it differentiates the tanh form, as its forward applies, is
      // what MlpGeluCuda.TheDgeluEpilogueComputesTheTanhFormsDerivative checks. It takes no bias
      // vector (cublasLt.h names only the aux input for it). DGELU_BGRAD would also write a bias
      // gradient through the bias pointer, but cublasLt.h does not say over which dimension it
      // reduces, and it would come in C's dtype: the first layer's bias gradient is a column sum
      // of dpre, in the parameter's dtype, as linear's is (GemmEpilogue::row_sums).
      check_gelu_matrix("DGELU");
      epilogue = CUBLASLT_EPILOGUE_DGELU;
      break;
    case Epilogue::row_sums:
      MT_INTERNAL_ASSERT(false, "matmul: row sums are a reduction beside the GEMM, not a cuBLASLt epilogue (",
                         describe_problem(p), ")");
      break;
  }
  const bool with_bias = bias.defined();
  const bool with_aux = gelu_matrix.defined();
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  }
  if (with_bias) {
    // The bias vector goes through the bias attributes, in C's dtype.
    const void* vector = bias.data_ptr();
    const cudaDataType_t vector_type = p.c.tensor.dtype() == DType::f32 ? CUDA_R_32F : type;
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof(vector)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vector_type,
                                                   sizeof(vector_type)));
  }
  if (with_aux) {
    void* aux = gelu_matrix.data_ptr();
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  }
  const Layout layout_a = make_layout(type, lt_a, batch);
  const Layout layout_b = make_layout(type, lt_b, batch);
  // C and D: the same matrix, in the inputs' dtype or f32 (gemm() allows f32 C for f16/bf16 A, B).
  const cudaDataType_t c_type = p.c.tensor.dtype() == DType::f32 ? CUDA_R_32F : type;
  const Layout layout_c = make_layout(c_type, lt_c, batch);

  // Timing needs the host to wait for the device, and another process could time another winner:
  // wanted only when asked for and repeatable results are not (backends.h).
  const bool tuning_wanted = backends::matmul_autotune() && !backends::deterministic_algorithms();
  const AlgoKey key = {device,
                       static_cast<int64_t>(type),
                       p.batch,
                       p.m,
                       p.n,
                       p.k,
                       lt_a.op,
                       lt_b.op,
                       lt_a.ld,
                       lt_b.ld,
                       lt_c.ld,
                       lt_a.batch_stride,
                       lt_b.batch_stride,
                       lt_c.batch_stride,
                       lt_a.alignment,
                       lt_b.alignment,
                       lt_c.alignment,
                       static_cast<int64_t>(compute),
                       static_cast<int64_t>(c_type),
                       static_cast<int64_t>(epilogue),
                       with_bias ? static_cast<int64_t>(alignment_of(bias.data_ptr())) : 0,
                       with_aux ? static_cast<int64_t>(alignment_of(gelu_matrix.data_ptr())) : 0,
                       tuning_wanted ? 1 : 0};
  AlgoChoice choice{};
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(algo_mutex());
    auto it = algo_cache().find(key);
    if (it != algo_cache().end()) {
      choice = it->second;
      cached = true;
    }
  }
  if (!cached) {
    const Preference pref =
        lt::make_preference(kWorkspaceBytes, lt_a.alignment, lt_b.alignment, lt_c.alignment, lt_c.alignment);
    // Not while a graph is being captured: that launch takes the heuristic's first, uncached, so
    // that the next eager launch still tunes the problem.
    const bool autotune = tuning_wanted && !cuda::capturing();
    std::array<cublasLtMatmulHeuristicResult_t, kAutotuneCandidates> results{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, raw_desc, layout_a.get(), layout_b.get(), layout_c.get(), layout_c.get(), pref.get(),
        /*requestedAlgoCount=*/autotune ? kAutotuneCandidates : 1, results.data(), &found);
    // An epilogue narrows the choice: cuBLASLt says so with no result or with NOT_SUPPORTED.
    // Without one it always has an algorithm.
    const bool optional_epilogue = with_aux;
    if (optional_epilogue && status == CUBLAS_STATUS_NOT_SUPPORTED) {
      found = 0;
    } else {
      MT_CUBLAS_CHECK(status);
    }
    MT_CHECK(found > 0 || optional_epilogue, "matmul: cuBLASLt found no algorithm for ", describe_problem(p));
    int best = 0;
    if (found > 1)
      best = autotune_problem<Scale>(p, results.data(), found, handle, raw_desc, layout_a.get(), layout_b.get(),
                                     layout_c.get(), lt_a, lt_b, lt_c, device, stream);
    choice = AlgoChoice{results[best].algo, results[best].workspaceSize, found > 0};
    if (autotune == tuning_wanted) {
      std::lock_guard<std::mutex> lock(algo_mutex());
      algo_cache().emplace(key, choice);
    }
  }
  if (!choice.available) return false;
  MT_INTERNAL_ASSERT(choice.workspace_bytes <= kWorkspaceBytes, "matmul: the heuristic asked for ",
                     choice.workspace_bytes, " bytes of workspace");

  const Scale alpha = static_cast<Scale>(p.alpha), beta = static_cast<Scale>(p.beta);
  void* c = p.c.tensor.data_ptr();
  MT_CUBLAS_CHECK(cublasLtMatmul(handle, raw_desc, &alpha, lt_a.data, layout_a.get(), lt_b.data, layout_b.get(), &beta,
                                 c, layout_c.get(), c, layout_c.get(), &choice.algo, workspace_for(device, stream),
                                 kWorkspaceBytes, stream.handle()));
  return true;
}

}  // namespace

void* cublaslt_handle(int device) { return handle_for(device); }
void* cublaslt_workspace(int device) { return workspace_for(device, cuda::current_stream(device)); }
size_t cublaslt_workspace_bytes() { return kWorkspaceBytes; }

bool gemm_cuda(const GemmProblem& p) {
  // Dispatched on the inputs' dtype: C may be f32 for f16/bf16 inputs (see gemm_typed).
  bool done = true;
  dispatch_floating(p.a.tensor.dtype(), "matmul",
                    [&](auto tag) { done = gemm_typed<typename decltype(tag)::type>(p); });
  return done;
}

}  // namespace mt::ops
