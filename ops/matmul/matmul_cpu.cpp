// CPU GEMMs through Eigen: one matrix product per batch entry, each operand
// mapped in place (row- or column-major with its leading dimension). f64
// computes in double, f32 in float; f16/bf16 matrices are widened to float
// buffers first and the result is rounded once.
#include <Eigen/Core>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "ops/matmul/matmul_kernels.h"

namespace mt::ops {

namespace {

template <typename A>
using RowMajorMap =
    Eigen::Map<const Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <typename A>
using ColMajorMap =
    Eigen::Map<const Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>, 0, Eigen::OuterStride<>>;
template <typename A>
using OutMap = Eigen::Map<Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;

// Calls f with an Eigen view of the matrix of `op` that starts at data.
template <typename A, typename F>
void with_matrix(const A* data, const MatrixOperand& op, F&& f) {
  if (op.order == Order::row_major) {
    f(RowMajorMap<A>(data, op.rows, op.cols, Eigen::OuterStride<>(op.ld)));
  } else {
    f(ColMajorMap<A>(data, op.rows, op.cols, Eigen::OuterStride<>(op.ld)));
  }
}

// c = alpha * a @ b + beta * c for one matrix (beta == 0: c is not read).
template <typename A>
void gemm_one(OutMap<A>& c, const A* a, const MatrixOperand& la, const A* b, const MatrixOperand& lb, A alpha, A beta) {
  with_matrix(a, la, [&](const auto& ma) {
    with_matrix(b, lb, [&](const auto& mb) {
      if (beta == A(0)) {
        c.noalias() = alpha * (ma * mb);
      } else {
        if (beta != A(1)) c *= beta;
        c.noalias() += alpha * (ma * mb);
      }
    });
  });
}

// One matrix of `op` (of storage type T) widened into a row-major [rows, cols] buffer.
template <typename T, typename A>
void widen(const T* src, const MatrixOperand& op, A* dst) {
  for (int64_t r = 0; r < op.rows; ++r) {
    for (int64_t c = 0; c < op.cols; ++c) {
      dst[r * op.cols + c] = convert<A>(src[op.order == Order::row_major ? r * op.ld + c : c * op.ld + r]);
    }
  }
}

// The layout of a buffer filled by widen().
MatrixOperand packed(const MatrixOperand& op) {
  MatrixOperand p;
  p.rows = op.rows;
  p.cols = op.cols;
  p.order = Order::row_major;
  p.ld = op.cols;
  return p;
}

template <typename T>
void gemm_typed(const GemmProblem& p) {
  using A = acc_t<T>;
  const T* a = static_cast<const T*>(p.a.tensor.data_ptr());
  const T* b = static_cast<const T*>(p.b.tensor.data_ptr());
  T* c = static_cast<T*>(p.c.tensor.data_ptr());
  const A alpha = static_cast<A>(p.alpha), beta = static_cast<A>(p.beta);
  if constexpr (std::is_same_v<T, A>) {
    // A batch of small products (attention's per-head GEMMs) runs one product per thread;
    // inside a parallel region Eigen keeps each product on its thread. A single product
    // is left to Eigen, which splits large ones across the cores itself.
    const bool across_batch = p.batch > 1 && p.batch * p.m * p.n * p.k >= (int64_t{1} << 18);
#pragma omp parallel for schedule(static) if (across_batch)
    for (int64_t i = 0; i < p.batch; ++i) {
      OutMap<A> cm(c + i * p.c.batch_stride, p.m, p.n, Eigen::OuterStride<>(p.c.ld));
      gemm_one<A>(cm, a + i * p.a.batch_stride, p.a, b + i * p.b.batch_stride, p.b, alpha, beta);
    }
  } else {
    std::vector<A> abuf(static_cast<size_t>(p.m * p.k)), bbuf(static_cast<size_t>(p.k * p.n)),
        cbuf(static_cast<size_t>(p.m * p.n));
    const MatrixOperand la = packed(p.a), lb = packed(p.b);
    for (int64_t i = 0; i < p.batch; ++i) {
      // A matrix shared by the batch (batch stride 0) is widened once.
      if (i == 0 || p.a.batch_stride != 0) widen(a + i * p.a.batch_stride, p.a, abuf.data());
      if (i == 0 || p.b.batch_stride != 0) widen(b + i * p.b.batch_stride, p.b, bbuf.data());
      T* ci = c + i * p.c.batch_stride;
      if (beta != A(0)) widen(ci, p.c, cbuf.data());
      OutMap<A> cm(cbuf.data(), p.m, p.n, Eigen::OuterStride<>(p.n));
      gemm_one<A>(cm, abuf.data(), la, bbuf.data(), lb, alpha, beta);
      for (int64_t r = 0; r < p.m; ++r) {
        for (int64_t col = 0; col < p.n; ++col) ci[r * p.c.ld + col] = convert<T>(cbuf[r * p.n + col]);
      }
    }
  }
}

}  // namespace

void gemm_cpu(const GemmProblem& p) {
  // gemm() does every epilogue's work around these kernels (a bias as a copy under beta 1).
  MT_INTERNAL_ASSERT(p.epilogue.kind() == Epilogue::none, "matmul: the CPU kernels apply no epilogue");
  dispatch_floating(p.c.tensor.dtype(), "matmul", [&](auto tag) { gemm_typed<typename decltype(tag)::type>(p); });
}

}  // namespace mt::ops
