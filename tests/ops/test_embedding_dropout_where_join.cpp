// Op-contract cases for embedding, dropout, where / masked_fill and cat / stack /
// split, plus behaviour the contract does not cover (id validation, the dropout
// mask's statistics and replay, CPU/CUDA mask equality, error messages).
#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/anomaly.h"
#include "autograd/function.h"
#include "core/view.h"
#include "ops/dropout/dropout.h"
#include "ops/embedding/embedding.h"
#include "ops/ops.h"
#include "ops/shape/join.h"
#include "ops/shape/windows.h"
#include "ops/where/where.h"
#include "tests/ops/op_contract.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

using In = std::vector<Tensor>;

Device gpu() { return cuda_device(0); }

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

// ---- dropout: a Generator made inside fn, so every call draws the same mask ----
MT_OP_CASE(OpCase("dropout", "dropout_p03").inputs({{4, 5}}).compute([](const In& x) {
  Generator gen(42);
  return dropout(x[0], 0.3, /*training=*/true, &gen);
}));
MT_OP_CASE(OpCase("dropout", "dropout_strided_input").inputs({{3, 6}}).compute([](const In& x) {
  Generator gen(7);
  return dropout(x[0].transpose(0, 1), 0.5, /*training=*/true, &gen);
}));

// ---- where / masked_fill ----
MT_OP_CASE(OpCase("where", "where_broadcast_b")
               .inputs({{2, 3}, {3}})
               .extra([] {
                 return In{from_vector({1, 0, 1, 0, 0, 1}, {2, 3}, DType::boolean)};
               })
               .compute([](const In& x) { return where(x[2], x[0], x[1]); }));
MT_OP_CASE(OpCase("where", "where_broadcast_all")
               .inputs({{2, 1}, {1, 3}})
               .extra([] {
                 return In{from_vector({0, 1, 1}, {3}, DType::u8)};
               })
               .compute([](const In& x) { return where(x[2], x[0], x[1]); }));
MT_OP_CASE(OpCase("masked_fill", "masked_fill_broadcast_mask")
               .inputs({{2, 3}})
               .extra([] {
                 return In{from_vector({1, 0, 1}, {3}, DType::u8)};
               })
               .compute([](const In& x) { return masked_fill(x[0], x[1], -1.5); }));
MT_OP_CASE(OpCase("masked_fill", "masked_fill_bool_mask")
               .inputs({{2, 2, 2}})
               .extra([] {
                 return In{from_vector({0, 1, 1, 0, 0, 0, 1, 1}, {2, 2, 2}, DType::boolean)};
               })
               .compute([](const In& x) { return masked_fill(x[0], x[1], 4.0); }));

// ---- cat / stack / split ----
MT_OP_CASE(OpCase("cat", "cat_dim1").inputs({{2, 3}, {2, 1}, {2, 2}}).compute([](const In& x) {
  return cat({x[0], x[1], x[2]}, 1);
}));
MT_OP_CASE(OpCase("cat", "cat_negative_dim").inputs({{1, 3}, {2, 3}}).compute([](const In& x) {
  return cat({x[0], x[1] * x[1], x[0]}, -2);  // the same input twice: its gradients add
}));
MT_OP_CASE(OpCase("stack", "stack_dim1").inputs({{2, 3}, {2, 3}}).compute([](const In& x) {
  return stack({x[0], x[1]}, 1);
}));
MT_OP_CASE(OpCase("stack", "stack_last_dim").inputs({{3}, {3}, {3}}).compute([](const In& x) {
  return stack({x[0], x[1], x[2]}, -1);
}));
MT_OP_CASE(OpCase("split", "split_chunks").inputs({{5, 2}}).compute([](const In& x) {
  const std::vector<Tensor> p = split(x[0], 2, 0);  // [2, 2], [2, 2], [1, 2]
  return cat({p[2] * 3.0, p[0], p[1] * p[1]}, 0);
}));
MT_OP_CASE(OpCase("split", "split_sizes").inputs({{2, 6}}).compute([](const In& x) {
  const std::vector<Tensor> p = split(x[0], std::vector<int64_t>{1, 3, 2}, 1);
  return cat({p[1], p[0] * p[2].narrow(1, 0, 1), p[2] * 2.0}, 1);
}));

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "'" << (haystack) << "' lacks '" << (needle) << "'"

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

// ---- dropout behaviour ----

TEST(Dropout, FractionKeptIsOneMinusPAndKeptValuesAreScaled) {
  const int64_t n = 1000000;
  const double p = 0.3;
  Generator gen(2024);
  const std::vector<double> out = dropout(ones({n}), p, /*training=*/true, &gen).to_vector<double>();
  int64_t kept = 0;
  for (double v : out) {
    if (v != 0.0) {
      ++kept;
      ASSERT_NEAR(v, 1.0 / (1.0 - p), 1e-6);
    }
  }
  // The kept count is Binomial(n, 1 - p): standard deviation sqrt(n p (1 - p)) = 458.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 3e-3);
  EXPECT_EQ(gen.offset(), static_cast<uint64_t>(n / 4));
}

TEST(Dropout, ReplayWithTheSameSeedAndOffsetGivesTheSameOutput) {
  Generator gen(11);
  const Tensor x = randn({7, 5}, DType::f32, &gen);
  gen.set_offset(100);
  const std::vector<double> first = dropout(x, 0.5, true, &gen).to_vector<double>();
  EXPECT_EQ(gen.offset(), 100u + 9u);  // ceil(35 / 4) counters
  const std::vector<double> next = dropout(x, 0.5, true, &gen).to_vector<double>();
  EXPECT_NE(first, next);  // the offset moved on: a fresh mask
  gen.set_offset(100);
  EXPECT_EQ(dropout(x, 0.5, true, &gen).to_vector<double>(), first);
  Generator same(11);
  same.set_offset(100);
  EXPECT_EQ(dropout(x, 0.5, true, &same).to_vector<double>(), first);
}

TEST(Dropout, BackwardRecomputesTheForwardMask) {
  Generator gen(5);
  Tensor x = ones({1001}, DType::f64).requires_grad_();  // not a multiple of 4: the tail counter
  const Tensor out = dropout(x, 0.25, true, &gen);
  sum(out).backward();
  // d out / d x = out / x = out: the mask times 1 / (1 - p), element for element.
  EXPECT_EQ(x.grad().to_vector<double>(), out.to_vector<double>());
  const std::vector<double> v = out.to_vector<double>();
  EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](double e) { return e == 0.0; }));
}

// Strided inputs: [6, 4] (a transposed [4, 6]) and [20001, 7] (140007 elements, split across CPU
// tasks, the last group of four short).
TEST(Dropout, MaskMatchesPhiloxUniformAtEachLogicalIndex) {
  for (const int64_t cols : {int64_t{6}, int64_t{20001}}) {
    Generator gen(123);
    gen.set_offset(17);
    const double p = 0.4;
    const Tensor x = arange(1.0, 4.0 * static_cast<double>(cols) + 1.0, 1.0, DType::f64).reshape({4, cols});
    const Tensor strided = (cols == 6 ? x : cat({x, x.narrow(0, 0, 3)}, 0)).transpose(0, 1);
    const std::vector<double> out = dropout(strided, p, true, &gen).to_vector<double>();
    const std::vector<double> xs = strided.contiguous().to_vector<double>();
    ASSERT_EQ(out.size(), xs.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const bool keep = philox::uniform_at(123, 17, i) >= p;
      ASSERT_EQ(out[i], keep ? xs[i] * (1.0 / (1.0 - p)) : 0.0) << cols << " columns, element " << i;
    }
  }
}

TEST(Dropout, EvalModeAndZeroPReturnTheInputAndDrawNothing) {
  Tensor x = ones({8}).requires_grad_();
  Generator gen(1);
  EXPECT_EQ(dropout(x, 0.5, /*training=*/false, &gen).impl(), x.impl());
  EXPECT_EQ(dropout(x, 0.0, /*training=*/true, &gen).impl(), x.impl());
  EXPECT_EQ(gen.offset(), 0u);
}

TEST(Dropout, POneGivesZerosAndAZeroGradient) {
  Tensor x = ones({6}, DType::f64).requires_grad_();
  const Tensor out = dropout(x, 1.0, true);
  EXPECT_EQ(out.to_vector<double>(), std::vector<double>(6, 0.0));
  sum(out).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(6, 0.0));
}

TEST(Dropout, RejectsPOutsideTheUnitInterval) {
  EXPECT_CONTAINS(error_of([] { dropout(ones({2}), -0.1, true); }), "dropout");
  EXPECT_CONTAINS(error_of([] { dropout(ones({2}), 1.5, true); }), "1.5");
  EXPECT_FALSE(error_of([] { dropout(ones({2}), std::nan(""), true); }).empty());
}

TEST(Dropout, DefaultGeneratorAdvances) {
  Generator& gen = default_generator(kCPU);
  const uint64_t before = gen.offset();
  dropout(ones({10}), 0.5, true);
  EXPECT_EQ(gen.offset(), before + 3);
}

TEST(Dropout, CpuAndCudaMasksAreEqual) {
  MT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    Generator a(99), b(99);
    a.set_offset(5);
    b.set_offset(5);
    const Tensor x = ones({1001, 3}, dtype);  // odd size: a partial last counter
    const std::vector<double> cpu = dropout(x, 0.3, true, &a).to_vector<double>();
    const std::vector<double> cuda = dropout(x.to(gpu()), 0.3, true, &b).to_vector<double>();
    EXPECT_EQ(cpu, cuda) << dtype_name(dtype);
    EXPECT_EQ(a.offset(), b.offset());
  }
}

// ---- where / masked_fill behaviour ----

TEST(Where, SelectsAndPromotes) {
  const Tensor c = from_vector({1, 0, 1}, {3}, DType::boolean);
  const Tensor out = where(c, from_vector({1, 2, 3}, {3}, DType::f16), from_vector({-1}, {1}, DType::f32));
  EXPECT_EQ(out.dtype(), DType::f32);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1, -1, 3}));
}

TEST(Where, GradientsGoToTheSelectedSideSummedOverBroadcast) {
  Tensor a = from_vector({1, 2}, {2, 1}, DType::f64).requires_grad_();
  Tensor b = from_vector({5, 6, 7}, {3}, DType::f64).requires_grad_();
  const Tensor c = from_vector({1, 0, 0, 1, 1, 0}, {2, 3}, DType::u8);
  sum(where(c, a, b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0, 1, 2}));
}

TEST(Where, RejectsFloatConditionAndBadShapes) {
  EXPECT_THROW(where(ones({2}), ones({2}), ones({2})), DTypeError);
  const std::string msg = error_of([] { where(ones({2}, DType::boolean), ones({3}), ones({3})); });
  EXPECT_CONTAINS(msg, "where");
  EXPECT_CONTAINS(msg, "[2]");
  EXPECT_CONTAINS(msg, "[3]");
}

TEST(MaskedFill, FillsNegativeInfinityAndBlocksTheGradient) {
  Tensor x = from_vector({1, 2, 3, 4}, {2, 2}, DType::f32).requires_grad_();
  const Tensor mask = from_vector({0, 1}, {2}, DType::boolean);
  const Tensor out = masked_fill(x, mask, -std::numeric_limits<double>::infinity());
  const std::vector<double> v = out.to_vector<double>();
  EXPECT_EQ(v[0], 1.0);
  EXPECT_TRUE(std::isinf(v[1]) && v[1] < 0);
  EXPECT_EQ(v[2], 3.0);
  sum(masked_fill(x, mask, 0.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 0, 1, 0}));
}

TEST(MaskedFill, MaskMustBroadcastToTheInput) {
  const std::string msg = error_of([] { masked_fill(ones({3}), ones({2, 3}, DType::boolean), 0.0); });
  EXPECT_CONTAINS(msg, "masked_fill");
  EXPECT_CONTAINS(msg, "[2, 3]");
  EXPECT_THROW(masked_fill(ones({3}), ones({3}, DType::f32), 0.0), DTypeError);
}

// Transposed and broadcast operands over more elements than one CPU task takes (the loop
// splits across threads): every element is the selected operand's, by index.
TEST(Where, StridedAndBroadcastOperandsSelectElementByElement) {
  Generator gen(9);
  const int64_t n0 = 33, n1 = 40, n2 = 70;
  const Tensor a_t = randn({n2, n0}, DType::f32, &gen);  // a = a_t^T, seen as [n0, 1, n2]
  const Tensor a = a_t.transpose(0, 1).unsqueeze(1);
  const Tensor b = randn({1, n1, n2}, DType::f32, &gen);
  std::vector<double> cv(static_cast<size_t>(n1 * n2));
  for (size_t i = 0; i < cv.size(); ++i) cv[i] = (i * 7) % 3 == 0;
  const Tensor c = from_vector(cv, {n1, n2}, DType::u8);
  const std::vector<double> out = where(c, a, b).to_vector<double>();
  const std::vector<double> av = a_t.to_vector<double>(), bv = b.to_vector<double>();
  ASSERT_EQ(out.size(), static_cast<size_t>(n0 * n1 * n2));
  for (int64_t i = 0; i < n0; ++i) {
    for (int64_t j = 0; j < n1; ++j) {
      for (int64_t k = 0; k < n2; ++k) {
        const double want = cv[j * n2 + k] != 0 ? av[k * n0 + i] : bv[j * n2 + k];
        ASSERT_EQ(out[(i * n1 + j) * n2 + k], want) << i << ", " << j << ", " << k;
      }
    }
  }
}

TEST(Where, CudaMatchesCpuForLargeBroadcast) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(8);
  const Tensor a = randn({33, 1, 70}, DType::f32, &gen), b = randn({1, 40, 70}, DType::f32, &gen);
  std::vector<double> cv(40 * 70);
  for (size_t i = 0; i < cv.size(); ++i) cv[i] = (i * 7) % 3 == 0;
  const Tensor c = from_vector(cv, {40, 70}, DType::boolean);
  EXPECT_EQ(where(c.to(gpu()), a.to(gpu()), b.to(gpu())).to_vector<double>(), where(c, a, b).to_vector<double>());
}

// ---- cat / stack / split behaviour ----

TEST(Join, CatConcatenatesAlongTheDim) {
  const Tensor a = from_vector({1, 2, 3, 4}, {2, 2}), b = from_vector({5, 6}, {2, 1});
  const Tensor out = cat({a, b}, 1);
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1, 2, 5, 3, 4, 6}));
  EXPECT_EQ(cat({a, zeros({0, 2})}, 0).shape(), (Shape{2, 2}));  // an empty input is fine
}

TEST(Join, CatErrorsNameShapesDtypesAndTheDim) {
  const std::string shape = error_of([] { cat({ones({2, 3}), ones({3, 3})}, 1); });
  EXPECT_CONTAINS(shape, "cat");
  EXPECT_CONTAINS(shape, "[2, 3]");
  EXPECT_CONTAINS(shape, "[3, 3]");
  EXPECT_CONTAINS(shape, "dimension 1");
  EXPECT_THROW(cat({ones({2}), ones({2}, DType::f64)}, 0), DTypeError);
  EXPECT_THROW(cat({ones({2}), ones({2, 1})}, 0), ShapeError);
  EXPECT_THROW(cat({}, 0), Error);
  EXPECT_THROW(cat({ones({2})}, 1), ShapeError);  // dim out of range
}

TEST(Join, StackAddsADimension) {
  const Tensor a = from_vector({1, 2}, {2}), b = from_vector({3, 4}, {2});
  EXPECT_EQ(stack({a, b}, 0).to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));
  const Tensor s = stack({a, b}, -1);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{1, 3, 2, 4}));
  EXPECT_CONTAINS(error_of([] { stack({ones({2}), ones({3})}, 0); }), "stack");
}

TEST(Join, SplitReturnsViewsWithASmallerLastChunk) {
  const Tensor x = arange(0.0, 10.0, 1.0, DType::f32).reshape({5, 2});
  const std::vector<Tensor> p = split(x, 2, 0);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[2].shape(), (Shape{1, 2}));
  EXPECT_EQ(p[2].to_vector<double>(), (std::vector<double>{8, 9}));
  for (const Tensor& t : p) EXPECT_TRUE(t.shares_storage_with(x));
  const std::vector<Tensor> q = split(x, std::vector<int64_t>{1, 0, 1}, 1);
  EXPECT_EQ(q[1].shape(), (Shape{5, 0}));
  EXPECT_EQ(q[2].to_vector<double>(), (std::vector<double>{1, 3, 5, 7, 9}));
}

TEST(Join, SplitErrors) {
  const std::string sizes = error_of([] { split(ones({2, 6}), std::vector<int64_t>{1, 2}, 1); });
  EXPECT_CONTAINS(sizes, "sum to 3");
  EXPECT_CONTAINS(sizes, "6");
  EXPECT_THROW(split(ones({4}), 0, 0), Error);
}

TEST(Join, SplitThenCatGradientRoundTrips) {
  Tensor x = arange(0.0, 6.0, 1.0, DType::f64).reshape({3, 2}).detach().requires_grad_();
  const std::vector<Tensor> p = split(x, 1, 0);
  sum(cat({p[0] * 1.0, p[1] * 2.0, p[2] * 3.0}, 0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 1, 2, 2, 3, 3}));
}

TEST(Windows, DenseLayoutIsAPermutedContiguousLayout) {
  EXPECT_TRUE(ops::dense_layout({2, 3, 4}, {12, 4, 1}));
  EXPECT_TRUE(ops::dense_layout({2, 3, 4}, {1, 8, 2}));    // permuted
  EXPECT_TRUE(ops::dense_layout({2, 1, 4}, {4, 99, 1}));   // a size-1 dim's stride is free
  EXPECT_FALSE(ops::dense_layout({2, 3, 4}, {24, 4, 1}));  // a gap after every 12
  EXPECT_FALSE(ops::dense_layout({2, 3}, {1, 1}));         // slots reached twice
  EXPECT_FALSE(ops::dense_layout({2, 3}, {0, 1}));         // expanded
  EXPECT_FALSE(ops::dense_layout({0, 3}, {3, 1}));         // nothing at all
}

TEST(Windows, EmptyWindowsLikeLaysOutTheSplitPiecesOfOneBufferAsTheyWere) {
  const Tensor qkv = zeros({2, 3, 12});  // [B, T, 3C], C = 4
  const std::vector<Tensor> pieces = split(qkv, 4, 2);
  const std::vector<Tensor> fresh = ops::empty_windows_like(pieces);
  ASSERT_EQ(fresh.size(), 3u);
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_FALSE(fresh[j].shares_storage_with(qkv));
    EXPECT_TRUE(fresh[j].shares_storage_with(fresh[0]));
    EXPECT_EQ(fresh[j].shape(), pieces[j].shape());
    EXPECT_EQ(fresh[j].strides(), pieces[j].strides());
    EXPECT_EQ(fresh[j].offset(), 4 * static_cast<int64_t>(j));
  }
  EXPECT_EQ(fresh[0].storage()->nbytes(), qkv.nbytes());
  // Not windows of one dense block: separate tensors, a gap, the wrong order, one piece.
  EXPECT_TRUE(ops::empty_windows_like({zeros({3, 4}).narrow(0, 0, 2), zeros({3, 4}).narrow(0, 1, 2)}).empty());
  const std::vector<Tensor> spaced = split(zeros({2, 3, 15}), 5, 2);
  EXPECT_TRUE(ops::empty_windows_like({spaced[0].narrow(2, 0, 4), spaced[1].narrow(2, 0, 4), spaced[2].narrow(2, 0, 4)})
                  .empty());
  EXPECT_TRUE(ops::empty_windows_like({pieces[1], pieces[0], pieces[2]}).empty());
  EXPECT_TRUE(ops::empty_windows_like({pieces[0]}).empty());
}

TEST(Windows, JoinedViewIsTheTensorThePiecesAreWindowsOf) {
  const Tensor whole = arange(0.0, 24.0, 1.0, DType::f32).reshape({2, 12});
  const std::vector<Tensor> pieces = split(whole, std::vector<int64_t>{3, 0, 9}, 1);
  const Tensor joined = ops::joined_view({pieces[0], Tensor(), pieces[2]}, 1, {0, 3, 3}, {3, 0, 9}, {2, 12});
  ASSERT_TRUE(joined.defined());
  EXPECT_TRUE(joined.shares_storage_with(whole));
  EXPECT_EQ(joined.offset(), whole.offset());
  EXPECT_EQ(joined.to_vector<double>(), whole.to_vector<double>());
  // A copy of one piece, pieces out of order, a missing piece, a window of a wider tensor.
  EXPECT_FALSE(ops::joined_view({pieces[0].clone(), pieces[1], pieces[2]}, 1, {0, 3, 3}, {3, 0, 9}, {2, 12}).defined());
  EXPECT_FALSE(ops::joined_view({pieces[2], pieces[1], pieces[0]}, 1, {0, 9, 9}, {9, 0, 3}, {2, 12}).defined());
  EXPECT_FALSE(ops::joined_view({pieces[0], pieces[1], Tensor()}, 1, {0, 3, 3}, {3, 0, 9}, {2, 12}).defined());
  const std::vector<Tensor> inner = split(whole.narrow(1, 0, 8), 4, 1);
  EXPECT_FALSE(ops::joined_view(inner, 1, {0, 4}, {4, 4}, {2, 8}).defined());
}

// An op whose backward writes its inputs' gradients as windows of one buffer (as attention
// does for a split qkv): split's backward hands that buffer on as x's gradient, no copy.
TEST(Join, SplitBackwardPassesOnGradientsThatAreWindowsOfOneBuffer) {
  const Tensor leaf = zeros({2, 3, 12}).requires_grad_();
  const Tensor x = leaf * 1.0;
  const std::vector<Tensor> pieces = split(x, 4, 2);
  Tensor written;  // the buffer the op's backward wrote
  auto node = std::make_shared<autograd::LambdaNode>(
      "WindowsBackward", [&written](const std::vector<Tensor>&, const autograd::LambdaNode& self) {
        std::vector<Tensor> in = {self.unpack(0), self.unpack(1), self.unpack(2)};
        std::vector<Tensor> grads = ops::empty_windows_like(in);
        for (size_t j = 0; j < grads.size(); ++j) grads[j].copy_(full(in[j].shape(), static_cast<double>(j + 1)));
        written = grads.at(0);
        return grads;
      });
  node->saved = {autograd::SavedTensor(pieces[0]), autograd::SavedTensor(pieces[1]), autograd::SavedTensor(pieces[2])};
  const Tensor out = zeros({1});
  autograd::record(node, pieces, {out});
  Tensor seen;  // what split's backward returned
  x.register_hook([&seen](const Tensor& g) {
    seen = g;
    return g;
  });
  out.backward(ones({1}));
  ASSERT_TRUE(seen.defined());
  EXPECT_TRUE(seen.shares_storage_with(written));
  std::vector<double> expected;
  for (int row = 0; row < 6; ++row)
    for (int j = 1; j <= 3; ++j) expected.insert(expected.end(), 4, j);
  EXPECT_EQ(leaf.grad().to_vector<double>(), expected);
}

TEST(Join, CatOnCudaMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const Tensor a = arange(0.0, 24.0, 1.0, DType::bf16).reshape({2, 3, 4});
  const Tensor b = arange(0.0, 8.0, 1.0, DType::bf16).reshape({2, 1, 4});
  EXPECT_EQ(cat({a.to(gpu()), b.to(gpu())}, 1).to_vector<double>(), cat({a, b}, 1).to_vector<double>());
  EXPECT_EQ(stack({a.to(gpu()), a.to(gpu())}, 3).to_vector<double>(), stack({a, a}, 3).to_vector<double>());
}

}  // namespace
}  // namespace mt::testing
