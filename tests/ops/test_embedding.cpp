// The embedding family (ops/embedding): op-contract cases, plus behaviour the contract does not
// cover: the gather and its shape, repeated ids in backward, dtypes, id validation, and on CUDA
// the scatter-add under contention, packed and element rows, a tied weight's gradient and
// out-of-range ids.
#include <algorithm>
#include <cmath>

#include "autograd/anomaly.h"
#include "ops/embedding/embedding.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// ---- embedding ----
MT_OP_CASE(OpCase("embedding", "embedding_repeated_ids")
               .inputs({{5, 3}})
               .extra([] {
                 return In{from_vector({0, 2, 2, 4, 1, 2}, {2, 3}, DType::i64)};
               })
               .compute([](const In& x) { return embedding(x[0], x[1]); }));
MT_OP_CASE(OpCase("embedding", "embedding_i32_ids")
               .inputs({{4, 2}})
               .extra([] {
                 return In{from_vector({3, 3, 0, 3}, {4}, DType::i32)};
               })
               .compute([](const In& x) { return embedding(x[0], x[1]); }));

// ---- embedding behaviour ----

TEST(Embedding, GathersRowsWithIdsShape) {
  const Tensor w = arange(0.0, 12.0, 1.0, DType::f32).reshape({4, 3});
  const Tensor ids = from_vector({3, 0, 1, 3}, {2, 2}, DType::i64);
  const Tensor out = embedding(w, ids);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{9, 10, 11, 0, 1, 2, 3, 4, 5, 9, 10, 11}));
}

TEST(Embedding, BackwardSumsRepeatedIdsAndLeavesOtherRowsZero) {
  Tensor w = zeros({4, 2}, DType::f64).requires_grad_();
  const Tensor ids = from_vector({1, 3, 1, 1}, {4}, DType::i32);
  const Tensor dy = from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}, DType::f64);
  embedding(w, ids).backward(dy);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{0, 0, 13, 16, 0, 0, 3, 4}));
}

TEST(Embedding, HalfWeightGradientKeepsItsDtype) {
  Tensor w = ones({3, 2}, DType::bf16).requires_grad_();
  sum(embedding(w, from_vector({2, 2, 2}, {3}, DType::i64))).backward();
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 3, 3}));
}

TEST(Embedding, OutOfRangeIdNamesTheIdAndV) {
  const Tensor w = ones({5, 2});
  const std::string high = error_of([&] { embedding(w, from_vector({1, 7}, {2}, DType::i64)); });
  EXPECT_CONTAINS(high, "embedding");
  EXPECT_CONTAINS(high, "id 7");
  EXPECT_CONTAINS(high, "V = 5");
  const std::string negative = error_of([&] { embedding(w, from_vector({-1}, {1}, DType::i32)); });
  EXPECT_CONTAINS(negative, "id -1");
}

TEST(Embedding, RejectsBadDtypesAndShapes) {
  EXPECT_THROW(embedding(ones({5, 2}), ones({3})), DTypeError);                       // float ids
  EXPECT_THROW(embedding(ones({5}), from_vector({0}, {1}, DType::i64)), ShapeError);  // 1-D weight
  EXPECT_THROW(embedding(ones({5, 2}, DType::i64), from_vector({0}, {1}, DType::i64)), DTypeError);
}

TEST(Embedding, EmptyIdsGiveEmptyOutputAndZeroGradient) {
  Tensor w = ones({3, 2}, DType::f64).requires_grad_();
  const Tensor out = embedding(w, zeros({0}, DType::i64));
  EXPECT_EQ(out.shape(), (Shape{0, 2}));
  sum(out).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(6, 0.0));
}

TEST(Embedding, CudaScatterAddMatchesCpuUnderContention) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(3);
  const int64_t V = 7, C = 65, N = 3000;  // many repeats of few rows: heavy atomic contention
  std::vector<double> id_values(N);
  for (int64_t n = 0; n < N; ++n) id_values[static_cast<size_t>(n)] = static_cast<double>((n * 5) % V);
  const Tensor ids = from_vector(id_values, {N}, DType::i64);
  const Tensor w = randn({V, C}, DType::f32, &gen);
  const Tensor dy = randn({N, C}, DType::f32, &gen);
  Tensor w_cpu = w.to(DType::f64).requires_grad_(), w_gpu = w.to(gpu()).requires_grad_();
  const Tensor out_gpu = embedding(w_gpu, ids.to(gpu()));
  embedding(w_cpu, ids).backward(dy.to(DType::f64));
  out_gpu.backward(dy.to(gpu()));
  EXPECT_EQ(out_gpu.to_vector<double>(), embedding(w, ids).to_vector<double>());
  const std::vector<double> got = w_gpu.grad().to_vector<double>(), want = w_cpu.grad().to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
}

// Rows of whole 16-byte packs (64 columns, and 520: a lane takes several packs of a row; the
// backward a thread per pack of 4) and rows that are not (66 columns of bf16, 65 of f32: a thread
// per element), over more rows than the grids hold at once, with repeated ids, i64 and i32: the
// CUDA forward gathers the CPU's rows bit for bit, and the f32 weight gradient, whose runs the
// CPU also sums in position order, equals the CPU's bit for bit. Then an out-of-range id gives a
// NaN row forward (the CPU refuses it; see OutOfRangeIdNamesTheIdAndV).
TEST(Embedding, CudaPackedAndElementRowsMatchTheCpuBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(5);
  const int64_t V = 50;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const int64_t C : {int64_t{64}, int64_t{520}, dtype == DType::f32 ? int64_t{65} : int64_t{66}}) {
      const int64_t N = C == 64 ? 40000 : 700;  // 40000 rows: 5000 blocks of 8 rows, more than the grid's 4224
      std::vector<double> id_values(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) id_values[static_cast<size_t>(n)] = static_cast<double>((n * n + 3 * n) % V);
      const DType id_dtype = C == 520 ? DType::i32 : DType::i64;
      const Tensor w = randn({V, C}, dtype, &gen);
      const Tensor dy = randn({N, C}, dtype, &gen);
      Tensor w_cpu = w.clone().requires_grad_(), w_gpu = w.to(gpu()).requires_grad_();
      const Tensor ids = from_vector(id_values, {N}, id_dtype);
      const Tensor out_cpu = embedding(w_cpu, ids), out_gpu = embedding(w_gpu, ids.to(gpu()));
      const std::string what = std::string(dtype_name(dtype)) + " C=" + std::to_string(C);
      EXPECT_EQ(out_gpu.to_vector<float>(), out_cpu.to_vector<float>()) << what;
      out_cpu.backward(dy);
      out_gpu.backward(dy.to(gpu()));
      if (dtype == DType::f32) EXPECT_EQ(w_gpu.grad().to_vector<float>(), w_cpu.grad().to_vector<float>()) << what;
      const std::vector<double> got = w_gpu.grad().to_vector<double>(), want = w_cpu.grad().to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << what;
      const Tensor bad = from_vector({1, static_cast<double>(V)}, {2}, DType::i64).to(gpu());
      const std::vector<float> rows = embedding(w.to(gpu()), bad).to_vector<float>();
      EXPECT_EQ(std::vector<float>(rows.begin(), rows.begin() + C), w.narrow(0, 1, 1).to_vector<float>()) << what;
      EXPECT_TRUE(std::all_of(rows.begin() + C, rows.end(), [](float v) { return std::isnan(v); })) << what;
    }
  }
}

// A weight tied to a linear layer (GPT's embedding and LM head): the embedding's rows are added
// into the gradient the linear's backward left in the engine (Node::apply_adding) instead of into
// zeros of their own; the sum equals the engine's add of the two, which anomaly detection keeps
// (it checks each node's own gradient), bit for bit, with the packed and the element kernels.
TEST(Embedding, CudaRowsAddIntoATiedWeightsGradientAsTheEngineWouldAddThem) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(8);
  const int64_t V = 37, T = 300;
  for (const int64_t C : {int64_t{64}, int64_t{65}}) {
    const Tensor w = randn({V, C}, DType::f32, &gen);
    const Tensor h = randn({T, C}, DType::f32, &gen);
    std::vector<double> id_values(static_cast<size_t>(T));
    for (int64_t n = 0; n < T; ++n) id_values[static_cast<size_t>(n)] = static_cast<double>((7 * n) % V);
    const Tensor ids = from_vector(id_values, {T}, DType::i64);
    const auto tied_grad = [&](const Device& device, bool anomaly) {
      AnomalyGuard guard(anomaly);
      Tensor weight = (device.is_cpu() ? w.clone() : w.to(device)).requires_grad_();
      const Tensor logits = linear(embedding(weight, ids.to(device)) + h.to(device), weight);  // [T, V]
      sum(logits * logits).backward();
      return weight.grad().to_vector<float>();
    };
    const std::vector<float> added = tied_grad(gpu(), false), engine = tied_grad(gpu(), true);
    EXPECT_EQ(added, engine) << "C=" << C;
    const std::vector<float> cpu = tied_grad(kCPU, false);
    for (size_t i = 0; i < cpu.size(); ++i) ASSERT_NEAR(added[i], cpu[i], 1e-3 * (1 + std::fabs(cpu[i]))) << i;
  }
}

TEST(Embedding, CudaOutOfRangeIdGivesNanRowWithoutFaulting) {
  MT_SKIP_WITHOUT_CUDA();
  const Tensor w = ones({3, 2}, gpu());
  const std::vector<double> out = embedding(w, from_vector({0, 9}, {2}, DType::i64).to(gpu())).to_vector<double>();
  EXPECT_EQ(out[0], 1.0);
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]));
}

}  // namespace
}  // namespace mt::testing
