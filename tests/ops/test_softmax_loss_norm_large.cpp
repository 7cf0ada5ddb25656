// The row-wise families (softmax, loss, norm) on CUDA at sizes the op contract's small cases do
// not reach, against f64 on the CPU (expect_cuda_matches_f64): rows wide enough for many warps,
// more rows than one grid launches, a GPT-2 vocabulary, several row groups for dweight / dbias.
// One test body for the three families, instantiated per dtype.
#include <string>
#include <vector>

#include "core/view.h"
#include "ops/loss/loss.h"
#include "ops/norm/norm.h"
#include "ops/ops.h"
#include "ops/softmax/softmax.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// ---- CUDA at sizes the contract's small cases do not reach: many warps per row,
// more rows than one grid launches, several row groups for dweight / dbias ----

// One dtype per case: under compute-sanitizer each case takes minutes, and they run side by side.
class SoftmaxLossNormCudaLarge : public ::testing::TestWithParam<DType> {};

TEST_P(SoftmaxLossNormCudaLarge, ShapesMatchF64Cpu) {
  MT_SKIP_WITHOUT_CUDA();
  const DType dtype = GetParam();
  Generator gen(12);
  const auto normal = [&](const Shape& shape, double scale = 1.0) { return randn(shape, DType::f64, &gen) * scale; };
  const Tensor wide = normal({3, 3001}, 4.0);     // 512 threads per row, each looping over 6 elements
  const Tensor tall = normal({70001, 3});         // more rows than blocks in the grid
  const Tensor logits = normal({6, 50257}, 3.0);  // a GPT-2 vocabulary
  std::vector<double> t = {17, -100, 50256, 0, 31337, 2};
  const Tensor target = from_vector(t, {6}, DType::i64);
  const Tensor x_norm = normal({1500, 768}, 2.0);  // 1500 rows: 24 row groups for dweight / dbias
  const Tensor w = normal({768}), b = normal({768});
  const double tol = tolerance_for(dtype);
  expect_cuda_matches_f64("softmax_wide", {wide}, Tensor(), dtype, tol, [](const In& x) { return softmax(x[0]); });
  expect_cuda_matches_f64("log_softmax_wide", {wide}, Tensor(), dtype, tol,
                          [](const In& x) { return log_softmax(x[0], 1); });
  expect_cuda_matches_f64("softmax_tall", {tall}, Tensor(), dtype, tol, [](const In& x) { return softmax(x[0]); });
  expect_cuda_matches_f64("log_softmax_tall_dim0", {normal({2, 700, 3})}, Tensor(), dtype, tol,
                          [](const In& x) { return log_softmax(x[0], 1); });
  expect_cuda_matches_f64("cross_entropy_vocab_mean", {logits}, target, dtype, tol,
                          [](const In& x) { return cross_entropy(x[0], x[1]); });
  expect_cuda_matches_f64("cross_entropy_vocab_none", {logits}, target, dtype, tol,
                          [](const In& x) { return cross_entropy(x[0], x[1], -100, Reduction::none); });
  expect_cuda_matches_f64("cross_entropy_tall_sum", {normal({70001, 3})},
                          raw::to(uniform({70001}, 0, 2.999, DType::f64, &gen), DType::i64), dtype, tol,
                          [](const In& x) { return cross_entropy(x[0], x[1], -100, Reduction::sum); });
  // Chunks of 256 rows: 3 chunks, the last partial; both gradients.
  expect_cuda_matches_f64("linear_cross_entropy_vocab", {normal({600, 768}), normal({50257, 768}, 0.02)},
                          raw::to(uniform({600}, 0, 50256.999, DType::f64, &gen), DType::i64), dtype, tol,
                          [](const In& x) {
                            LinearCrossEntropyOptions o;
                            o.chunk_rows = 256;
                            return linear_cross_entropy(x[0], x[1], x[2], o);
                          });
  // GPT-2's padded vocabulary, a multiple of 8: the fused softmax's 16-byte packs (50257 takes
  // one logit at a time).
  expect_cuda_matches_f64("linear_cross_entropy_vocab_packed", {normal({300, 64}), normal({50304, 64}, 0.3)},
                          raw::to(uniform({300}, 0, 50303.999, DType::f64, &gen), DType::i64), dtype, tol,
                          [](const In& x) {
                            LinearCrossEntropyOptions o;
                            o.chunk_rows = 128;
                            return linear_cross_entropy(x[0], x[1], x[2], o);
                          });
  // The packed rows with ignored targets: their loss and gradient rows are 0.
  expect_cuda_matches_f64("linear_cross_entropy_packed_ignored", {normal({6, 32}), normal({64, 32}, 0.5)},
                          from_vector({5, -100, 63, 0, -100, 17}, {6}, DType::i64), dtype, tol,
                          [](const In& x) { return linear_cross_entropy(x[0], x[1], x[2]); });
  expect_cuda_matches_f64("layer_norm_affine", {x_norm, w, b}, Tensor(), dtype, tol,
                          [](const In& x) { return layer_norm(x[0], x[1], x[2]); });
  // Packed rows (16 columns), enough of them that each warp reuses its ring of staged rows.
  expect_cuda_matches_f64("layer_norm_tall_packed", {normal({20011, 16}, 2.0), normal({16}), normal({16})}, Tensor(),
                          dtype, tol, [](const In& x) { return layer_norm(x[0], x[1], x[2]); });
  expect_cuda_matches_f64("rms_norm_wide", {normal({3, 5000}), normal({5000})}, Tensor(), dtype, tol,
                          [](const In& x) { return rms_norm(x[0], x[1]); });
  expect_cuda_matches_f64("rms_norm_tall", {normal({70001, 4}), normal({4})}, Tensor(), dtype, tol,
                          [](const In& x) { return rms_norm(x[0], x[1]); });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SoftmaxLossNormCudaLarge,
                         ::testing::Values(DType::f64, DType::f32, DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace mt::testing
