// Scaled dot-product attention: op-contract cases, values against a naive f64
// loop, the causal mask's reach, dropout replay and errors.
#include <cmath>
#include <limits>

#include "core/view.h"
#include "ops/attention/attention.h"
#include "ops/ops.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

using In = std::vector<Tensor>;

MT_OP_CASE(OpCase("sdpa", "sdpa").inputs({{1, 2, 3, 4}, {1, 2, 4, 4}, {1, 2, 4, 3}}).compute([](const In& x) {
  return scaled_dot_product_attention(x[0], x[1], x[2]);
}));
MT_OP_CASE(
    OpCase("sdpa", "sdpa_explicit_scale").inputs({{2, 1, 2, 3}, {2, 1, 3, 3}, {2, 1, 3, 2}}).compute([](const In& x) {
      return scaled_dot_product_attention(x[0], x[1], x[2], /*causal=*/false, /*dropout_p=*/0.0, /*scale=*/0.7);
    }));
MT_OP_CASE(
    OpCase("sdpa_causal", "sdpa_causal").inputs({{1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 2}}).compute([](const In& x) {
      return scaled_dot_product_attention(x[0], x[1], x[2], /*causal=*/true);
    }));
MT_OP_CASE(OpCase("sdpa_causal", "sdpa_causal_more_keys")
               .inputs({{1, 1, 3, 2}, {1, 1, 5, 2}, {1, 1, 5, 2}})
               .compute([](const In& x) { return scaled_dot_product_attention(x[0], x[1], x[2], /*causal=*/true); }));

// Grouped-query attention: 3 query heads per key/value head, causal and not; one query row
// against a longer cache (a generation step), which takes the composite on every device.
// D = 8: cuDNN's fused kernels on CUDA in bf16 and f16. An inf in v makes its backward's row term
// rowsum(dO * O) infinite; the exact order then subtracts inf from inf (NaN), cuDNN's keeps one inf.
constexpr const char* kFusedInfForNan = "cuDNN's fused backward gives +-inf where the exact order gives inf - inf";
MT_OP_CASE(OpCase("sdpa_gqa", "sdpa_gqa")
               .inputs({{2, 6, 3, 8}, {2, 2, 4, 8}, {2, 2, 4, 8}})
               .compute([](const In& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); })
               .cuda_inf_may_stand_for_nan(kFusedInfForNan));
// Causal: cuDNN's fused backward also computes the masked-out entries of a tile (probability 0
// times a NaN row term is NaN there, so a NaN query reaches keys it never attends to), and an
// infinite query gives a zero row where the exact order gives NaN: held to the dependency rule.
MT_OP_CASE(OpCase("sdpa_gqa", "sdpa_gqa_causal")
               .inputs({{1, 6, 5, 8}, {1, 2, 5, 8}, {1, 2, 5, 8}})
               .compute([](const In& x) { return scaled_dot_product_attention(x[0], x[1], x[2], /*causal=*/true); })
               .cuda_nonfinite_may_differ("cuDNN's fused causal kernels compute masked-out entries and rows of an "
                                          "infinite query otherwise than the exact order"));
MT_OP_CASE(OpCase("sdpa_gqa", "sdpa_gqa_one_query")
               .inputs({{2, 4, 1, 8}, {2, 2, 7, 8}, {2, 2, 7, 8}})
               .compute([](const In& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }));

// Packed rows: two rows of three and two sequences (ids 0..2 and 7, 9), causal grouped-query
// attention under their document mask; cuDNN runs it with the mask as an additive bias.
Tensor two_packed_rows(Device device) {
  return from_vector({0, 0, 0, 1, 1, 2, 2, 7, 7, 7, 7, 7, 9, 9}, {2, 7},
                     TensorOptions().dtype(DType::i64).device(device));
}
MT_OP_CASE(OpCase("sdpa_masked", "sdpa_document_mask_gqa_causal")
               .inputs({{2, 6, 7, 8}, {2, 2, 7, 8}, {2, 2, 7, 8}})
               .compute([](const In& x) {
                 return scaled_dot_product_attention(x[0], x[1], x[2], /*causal=*/true, 0.0, std::nullopt,
                                                     document_mask(two_packed_rows(x[0].device())));
               })
               .cuda_nonfinite_may_differ("cuDNN's fused causal kernels compute masked-out entries and rows of an "
                                          "infinite query otherwise than the exact order"));
// A floating mask is added to the scores (one mask for every batch row), without causality.
MT_OP_CASE(OpCase("sdpa_masked", "sdpa_float_mask")
               .inputs({{2, 2, 3, 8}, {2, 2, 4, 8}, {2, 2, 4, 8}})
               .compute([](const In& x) {
                 const Tensor bias =
                     from_vector({0.5, -1.0, 0.0, 2.0, -0.25, 0.0, 1.5, -2.0, 0.0, 0.75, -0.5, 1.0}, {1, 1, 3, 4},
                                 TensorOptions().dtype(x[0].dtype()).device(x[0].device()));
                 return scaled_dot_product_attention(x[0], x[1], x[2], /*causal=*/false, 0.0, std::nullopt, bias);
               })
               .cuda_nonfinite_may_differ("with a bias, cuDNN's fused backward gives an infinite v's row finite "
                                          "key gradients where the exact order gives inf - inf"));

// out[b, h, i, :] = sum_j softmax_j(scale q_i . k_j, masked j > i when causal) v_j, all in f64.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2), Dv = v.size(3);
  const std::vector<double> Q = q.to_vector<double>(), K = k.to_vector<double>(), V = v.to_vector<double>();
  std::vector<double> out(static_cast<size_t>(B * H * Tq * Dv), 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t i = 0; i < Tq; ++i) {
      std::vector<double> s(static_cast<size_t>(Tk));
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Tk; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += Q[static_cast<size_t>((bh * Tq + i) * D + d)] * K[static_cast<size_t>((bh * Tk + j) * D + d)];
        s[static_cast<size_t>(j)] = causal && j > i ? -std::numeric_limits<double>::infinity() : dot * scale;
        m = std::max(m, s[static_cast<size_t>(j)]);
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - m));
      for (int64_t j = 0; j < Tk; ++j) {
        for (int64_t c = 0; c < Dv; ++c) {
          out[static_cast<size_t>((bh * Tq + i) * Dv + c)] +=
              s[static_cast<size_t>(j)] / z * V[static_cast<size_t>((bh * Tk + j) * Dv + c)];
        }
      }
    }
  }
  return out;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// Query head h reads key/value head h / (H / Hkv): the same as repeating each k and v head.
TEST(Attention, GroupedQueryEqualsRepeatedKeysAndValues) {
  Generator gen(12);
  const Tensor q = randn({2, 6, 5, 8}, DType::f64, &gen), k = randn({2, 2, 5, 8}, DType::f64, &gen),
               v = randn({2, 2, 5, 8}, DType::f64, &gen);
  auto repeat = [](const Tensor& t) {
    return t.reshape({2, 2, 1, 5, 8}).expand({2, 2, 3, 5, 8}).reshape({2, 6, 5, 8});
  };
  for (const bool causal : {false, true}) {
    expect_near_all(scaled_dot_product_attention(q, k, v, causal).to_vector<double>(),
                    naive_attention(q, repeat(k), repeat(v), causal, 1 / std::sqrt(8.0)), 1e-12);
  }
}

TEST(Attention, MatchesNaiveLoop) {
  Generator gen(17);
  const Tensor q = randn({2, 1, 3, 5}, DType::f64, &gen), k = randn({2, 1, 4, 5}, DType::f64, &gen),
               v = randn({2, 1, 4, 2}, DType::f64, &gen);
  const Tensor out = scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(out.shape(), (Shape{2, 1, 3, 2}));
  expect_near_all(out.to_vector<double>(), naive_attention(q, k, v, false, 1.0 / std::sqrt(5.0)), 1e-12);
  expect_near_all(scaled_dot_product_attention(q, k, v, true).to_vector<double>(),
                  naive_attention(q, k, v, true, 1.0 / std::sqrt(5.0)), 1e-12);
  expect_near_all(scaled_dot_product_attention(q, k, v, false, 0.0, 0.25).to_vector<double>(),
                  naive_attention(q, k, v, false, 0.25), 1e-12);
}

TEST(Attention, F32MatchesNaiveLoop) {
  Generator gen(18);
  const Tensor q = randn({1, 2, 4, 8}, DType::f32, &gen), k = randn({1, 2, 4, 8}, DType::f32, &gen),
               v = randn({1, 2, 4, 3}, DType::f32, &gen);
  const Tensor out = scaled_dot_product_attention(q, k, v, true);
  EXPECT_EQ(out.dtype(), DType::f32);
  expect_near_all(out.to_vector<double>(), naive_attention(q, k, v, true, 1.0 / std::sqrt(8.0)), 1e-5);
}

TEST(Attention, CausalRowZeroDependsOnlyOnKeyAndValueZero) {
  Generator gen(19);
  Tensor q = randn({1, 2, 4, 3}, DType::f64, &gen).requires_grad_();
  Tensor k = randn({1, 2, 4, 3}, DType::f64, &gen).requires_grad_();
  Tensor v = randn({1, 2, 4, 3}, DType::f64, &gen).requires_grad_();
  const Tensor out = scaled_dot_product_attention(q, k, v, true);
  // Row 0 attends key 0 alone: it equals v[..., 0, :].
  expect_near_all(out.narrow(2, 0, 1).to_vector<double>(), v.narrow(2, 0, 1).to_vector<double>(), 1e-12);
  sum(out.narrow(2, 0, 1)).backward();
  const std::vector<double> gk = k.grad().to_vector<double>(), gv = v.grad().to_vector<double>();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t j = 0; j < 4; ++j) {
      for (int64_t c = 0; c < 3; ++c) {
        const size_t at = static_cast<size_t>((h * 4 + j) * 3 + c);
        EXPECT_EQ(gk[at], 0.0) << "dk h " << h << " j " << j;  // softmax of one element: no gradient to k at all
        EXPECT_EQ(gv[at], j == 0 ? 1.0 : 0.0) << "dv h " << h << " j " << j;
      }
    }
  }
  // Changing later keys and values leaves row 0 alone, and changes row 3.
  Tensor k_late = k.detach().clone(), v_late = v.detach().clone();
  raw::narrow(k_late, 2, 1, 3).fill_(5.0);
  raw::narrow(v_late, 2, 1, 3).fill_(-7.0);
  const Tensor changed = scaled_dot_product_attention(q.detach(), k_late, v_late, true);
  expect_near_all(changed.narrow(2, 0, 1).to_vector<double>(), out.narrow(2, 0, 1).to_vector<double>(), 1e-12);
  EXPECT_NE(changed.narrow(2, 3, 1).to_vector<double>(), out.narrow(2, 3, 1).to_vector<double>());
}

TEST(Attention, CausalRowIDependsOnKeysUpToI) {
  Generator gen(20);
  const Tensor q = randn({1, 1, 5, 2}, DType::f64, &gen);
  Tensor k = randn({1, 1, 5, 2}, DType::f64, &gen).requires_grad_();
  Tensor v = randn({1, 1, 5, 2}, DType::f64, &gen).requires_grad_();
  sum(scaled_dot_product_attention(q, k, v, true).narrow(2, 2, 1)).backward();  // row 2
  const std::vector<double> gv = v.grad().to_vector<double>();
  for (int64_t j = 0; j < 5; ++j) {
    const double row = std::fabs(gv[static_cast<size_t>(j * 2)]) + std::fabs(gv[static_cast<size_t>(j * 2 + 1)]);
    if (j <= 2)
      EXPECT_GT(row, 0.0) << j;
    else
      EXPECT_EQ(row, 0.0) << j;
  }
}

TEST(Attention, DropoutIsAppliedAndReplaysFromTheGeneratorOffset) {
  Generator gen(21);
  const Tensor q = randn({1, 1, 6, 4}, DType::f64, &gen), k = randn({1, 1, 6, 4}, DType::f64, &gen),
               v = randn({1, 1, 6, 4}, DType::f64, &gen);
  Generator& cpu = default_generator(kCPU);
  const uint64_t start = cpu.offset();
  const std::vector<double> a = scaled_dot_product_attention(q, k, v, false, 0.5).to_vector<double>();
  EXPECT_EQ(cpu.offset(), start + 9);  // 36 attention weights: 9 Philox counters
  cpu.set_offset(start);
  EXPECT_EQ(scaled_dot_product_attention(q, k, v, false, 0.5).to_vector<double>(), a);
  EXPECT_NE(scaled_dot_product_attention(q, k, v).to_vector<double>(), a);
}

TEST(Attention, ErrorsNameShapesAndDtypes) {
  try {
    scaled_dot_product_attention(ones({1, 2, 3, 4}), ones({1, 2, 3, 5}), ones({1, 2, 3, 4}));
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("scaled_dot_product_attention"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 2, 3, 5]"), std::string::npos) << msg;
  }
  EXPECT_THROW(scaled_dot_product_attention(ones({2, 3, 4}), ones({2, 3, 4}), ones({2, 3, 4})), ShapeError);
  EXPECT_THROW(scaled_dot_product_attention(ones({1, 1, 2, 2}), ones({1, 1, 2, 2}, DType::f64), ones({1, 1, 2, 2})),
               DTypeError);
  EXPECT_THROW(scaled_dot_product_attention(ones({1, 1, 2, 2}), ones({1, 1, 2, 2}), ones({1, 1, 3, 2})), ShapeError);
}

TEST(Attention, DocumentMaskIsTrueWithinOneSegment) {
  const Tensor mask = document_mask(from_vector({4, 4, 5, 4}, {1, 4}, DType::i32));
  EXPECT_EQ(mask.shape(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(mask.to_vector<double>(), (std::vector<double>{1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1}));
  expect_contains(error_of([] { document_mask(ones({2, 3})); }), {"document_mask", "i64 or i32"});
  expect_contains(error_of([] { document_mask(ones({6}, DType::i64)); }), {"document_mask", "[B, T]"});
}

// Each sequence of a packed row is attended as if it were alone in its own row: outputs and the
// gradients of q, k and v equal those of the sequences run one by one (f64, to rounding).
void expect_packed_equals_separate(Device device, DType dtype, double tol) {
  Generator gen(31);
  const int64_t lengths[] = {3, 4};
  const Tensor q = randn({1, 6, 7, 8}, DType::f64, &gen).to(dtype).to(device).requires_grad_(),
               k = randn({1, 2, 7, 8}, DType::f64, &gen).to(dtype).to(device).requires_grad_(),
               v = randn({1, 2, 7, 8}, DType::f64, &gen).to(dtype).to(device).requires_grad_();
  const Tensor segments = from_vector({0, 0, 0, 1, 1, 1, 1}, {1, 7}, TensorOptions().dtype(DType::i64).device(device));
  const Tensor packed = scaled_dot_product_attention(q, k, v, true, 0.0, std::nullopt, document_mask(segments));
  const Tensor weights = randn({1, 6, 7, 8}, DType::f64, &gen).to(dtype).to(device);
  sum(mul(packed, weights)).backward();
  int64_t start = 0;
  for (const int64_t n : lengths) {
    const auto rows = [&](const Tensor& t) {
      return t.detach().slice(2, start, start + n).contiguous().requires_grad_();
    };
    const Tensor qs = rows(q), ks = rows(k), vs = rows(v);
    const Tensor alone = scaled_dot_product_attention(qs, ks, vs, true);
    sum(mul(alone, weights.slice(2, start, start + n))).backward();
    const auto part = [&](const Tensor& t) { return t.slice(2, start, start + n).to(kCPU).to_vector<double>(); };
    EXPECT_LE(relative_l2(part(packed.detach()), alone.detach().to(kCPU).to_vector<double>()), tol)
        << "rows from " << start;
    EXPECT_LE(relative_l2(part(q.grad()), qs.grad().to(kCPU).to_vector<double>()), tol) << "dq from " << start;
    EXPECT_LE(relative_l2(part(k.grad()), ks.grad().to(kCPU).to_vector<double>()), tol) << "dk from " << start;
    EXPECT_LE(relative_l2(part(v.grad()), vs.grad().to(kCPU).to_vector<double>()), tol) << "dv from " << start;
    start += n;
  }
}

TEST(Attention, PackedSequencesEqualSeparateRows) { expect_packed_equals_separate(kCPU, DType::f64, 1e-12); }
TEST(Attention, CudaPackedSequencesEqualSeparateRows) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  const Tensor segments = from_vector({3, 3, 1, 1, 1}, {1, 5}, TensorOptions().dtype(DType::i64).device(gpu));
  EXPECT_EQ(document_mask(segments).to(kCPU).to_vector<double>(), document_mask(segments.to(kCPU)).to_vector<double>());
  expect_packed_equals_separate(gpu, DType::bf16, 2e-2);  // cuDNN with the mask as a bias, against cuDNN alone
}

TEST(Attention, MaskErrorsNameTheMask) {
  const Tensor x = ones({1, 2, 3, 8});
  expect_contains(error_of([&] {
                    scaled_dot_product_attention(x, x, x, true, 0.0, std::nullopt, ones({1, 1, 3, 4}));
                  }),
                  {"scaled_dot_product_attention", "attn_mask", "[1 or 1, 1, 3, 3]", "[1, 1, 3, 4]"});
  expect_contains(error_of([&] {
                    scaled_dot_product_attention(x, x, x, true, 0.0, std::nullopt, ones({1, 1, 3, 3}, DType::i64));
                  }),
                  {"attn_mask", "bool", "i64"});
}

TEST(Attention, CudaCausalMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(22);
  const Tensor q = randn({2, 3, 17, 16}, DType::f32, &gen), k = randn({2, 3, 17, 16}, DType::f32, &gen),
               v = randn({2, 3, 17, 8}, DType::f32, &gen);
  const Device gpu = cuda_device(0);
  const Tensor got = scaled_dot_product_attention(q.to(gpu), k.to(gpu), v.to(gpu), true);
  expect_near_all(got.to_vector<double>(), naive_attention(q, k, v, true, 0.25), 2e-5);
}

}  // namespace
}  // namespace mt::testing
