// The matmul family (ops/matmul): op-contract cases for matmul, bmm, linear and lora_linear,
// plus what the contract does not cover: values against a naive triple loop, non-contiguous and
// misaligned operands, the GEMM entry point's alpha/beta, error messages, which inputs get (and
// which inputs are saved for) gradients, and f64 / autocast / autotuning / streams on CUDA. The
// fused GELU epilogues (linear_gelu, mlp_gelu) are in test_matmul_epilogues.cpp.
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/view.h"
#include "ops/backends.h"
#include "ops/matmul/matmul.h"
#include "ops/matmul/matmul_kernels.h"
#include "ops/ops.h"
#include "tests/ops/matmul_test_util.h"
#include "tests/ops/op_contract.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

using namespace matmul_test;

using In = std::vector<Tensor>;

// ---- matmul ----
MT_OP_CASE(OpCase("matmul", "matmul_2d").inputs({{3, 4}, {4, 5}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
MT_OP_CASE(OpCase("matmul", "matmul_batched").inputs({{2, 2, 3, 4}, {2, 2, 4, 3}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
// Batch dims [2, 1] and [3] broadcast to [2, 3]: neither operand has a single batch stride.
MT_OP_CASE(OpCase("matmul", "matmul_batch_broadcast").inputs({{2, 1, 3, 4}, {3, 4, 2}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
// A batch against one matrix: folded into a single GEMM (and dB into one GEMM over the batch).
MT_OP_CASE(OpCase("matmul", "matmul_batch_times_matrix").inputs({{2, 3, 4}, {4, 5}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
// One matrix against a batch: batch stride 0 for a, dA summed over the batch.
MT_OP_CASE(OpCase("matmul", "matmul_matrix_times_batch").inputs({{3, 4}, {2, 4, 5}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
MT_OP_CASE(OpCase("matmul", "matmul_vector_matrix").inputs({{4}, {4, 3}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
MT_OP_CASE(OpCase("matmul", "matmul_matrix_vector").inputs({{3, 4}, {4}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
MT_OP_CASE(OpCase("matmul", "matmul_dot").inputs({{5}, {5}}).compute([](const In& x) { return matmul(x[0], x[1]); }));
MT_OP_CASE(OpCase("matmul", "matmul_batch_vector").inputs({{2, 3, 4}, {4}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
MT_OP_CASE(OpCase("matmul", "matmul_vector_batch").inputs({{4}, {2, 4, 3}}).compute([](const In& x) {
  return matmul(x[0], x[1]);
}));
// Transposed views: column-major operands (read with the BLAS transpose flag, no copy).
MT_OP_CASE(OpCase("matmul", "matmul_transposed_views").inputs({{4, 3}, {5, 4}}).compute([](const In& x) {
  return matmul(x[0].transpose(0, 1), x[1].transpose(0, 1));
}));

// ---- bmm ----
MT_OP_CASE(OpCase("bmm", "bmm").inputs({{2, 3, 4}, {2, 4, 5}}).compute([](const In& x) { return bmm(x[0], x[1]); }));
MT_OP_CASE(OpCase("bmm", "bmm_transposed_views").inputs({{2, 4, 3}, {2, 5, 4}}).compute([](const In& x) {
  return bmm(x[0].transpose(1, 2), x[1].transpose(1, 2));
}));

// ---- linear ----
MT_OP_CASE(OpCase("linear", "linear_bias").inputs({{3, 4}, {5, 4}, {5}}).compute([](const In& x) {
  return linear(x[0], x[1], x[2]);
}));
MT_OP_CASE(OpCase("linear", "linear_no_bias").inputs({{3, 4}, {5, 4}}).compute([](const In& x) {
  return linear(x[0], x[1]);
}));
MT_OP_CASE(OpCase("linear", "linear_3d_input").inputs({{2, 3, 4}, {5, 4}, {5}}).compute([](const In& x) {
  return linear(x[0], x[1], x[2]);
}));
// Tile-sized: on CUDA the bias gradient is a column sum of dy by 16-byte reads (96 columns,
// 12 packs of 8 in bf16/f16) over 4 x 64 rows.
MT_OP_CASE(OpCase("linear", "linear_bias_epilogue_sized")
               .inputs({{4, 64, 32}, {96, 32}, {96}})
               .compute([](const In& x) { return linear(x[0], x[1], x[2]); })
               .no_gradcheck("linear_bias checks the same formulas in f64; this case sizes the CUDA epilogue"));
MT_OP_CASE(OpCase("linear", "linear_1d_input").inputs({{4}, {3, 4}, {3}}).compute([](const In& x) {
  return linear(x[0], x[1], x[2]);
}));

// ---- lora_linear: y = x W^T + b + scale (h A^T) B^T ----
MT_OP_CASE(OpCase("lora_linear", "lora_linear_separate_adapter_input")
               .inputs({{2, 3, 4}, {2, 3, 4}, {5, 4}, {5}, {2, 4}, {5, 2}})
               .compute([](const In& x) { return lora_linear(x[0], x[1], x[2], x[3], x[4], x[5], 1.5); }));
MT_OP_CASE(OpCase("lora_linear", "lora_linear_same_input_no_bias")  // h is x: dx sums both paths
               .inputs({{3, 4}, {5, 4}, {3, 4}, {5, 3}})
               .compute([](const In& x) { return lora_linear(x[0], x[0], x[1], Tensor(), x[2], x[3], 0.5); }));

// ---- values ----

TEST(Matmul, ValuesMatchNaiveLoopInEveryDtype) {
  const Tensor a = random({3, 5}, DType::f64, 1), b = random({5, 4}, DType::f64, 2);
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    // The reference sees the inputs rounded to `dtype`; the product rounds once at the end.
    const Tensor ar = raw::to(a, dtype), br = raw::to(b, dtype);
    const Tensor out = matmul(ar, br);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_EQ(out.shape(), (Shape{3, 4}));
    const double tol = dtype == DType::f64 ? 1e-13 : dtype == DType::f32 ? 1e-6 : dtype == DType::f16 ? 2e-3 : 1e-2;
    expect_close(out.to_vector<double>(), naive_matmul(raw::to(ar, DType::f64), raw::to(br, DType::f64)), tol);
  }
}

TEST(Matmul, BatchedBroadcastMatchesPerMatrixProducts) {
  const Tensor a = random({2, 1, 3, 4}, DType::f64, 3), b = random({3, 4, 2}, DType::f64, 4);
  const Tensor out = matmul(a, b);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 3, 2}));
  // Materialise the broadcast and compare with the definition.
  const Tensor ae = raw::contiguous(raw::expand(a, {2, 3, 3, 4})), be = raw::contiguous(raw::expand(b, {2, 3, 4, 2}));
  expect_close(out.to_vector<double>(), naive_matmul(ae, be), 1e-13);
}

TEST(Matmul, VectorOperandsFollowTorchShapes) {
  EXPECT_EQ(matmul(ones({4}), ones({4})).shape(), Shape{});
  EXPECT_EQ(matmul(ones({4}), ones({4})).item(), 4.0);
  EXPECT_EQ(matmul(ones({4}), ones({4, 3})).shape(), (Shape{3}));
  EXPECT_EQ(matmul(ones({3, 4}), ones({4})).shape(), (Shape{3}));
  EXPECT_EQ(matmul(ones({2, 3, 4}), ones({4})).shape(), (Shape{2, 3}));
  EXPECT_EQ(matmul(ones({4}), ones({2, 4, 3})).shape(), (Shape{2, 3}));
  EXPECT_EQ(matmul(ones({2, 1, 3, 4}), ones({5, 4, 6})).shape(), (Shape{2, 5, 3, 6}));
}

TEST(Matmul, NonContiguousOperandsMatchContiguousOnes) {
  const Tensor base = random({10, 12}, DType::f64, 5);
  // Transposed: column-major, read with the transpose flag.
  const Tensor at = raw::transpose(raw::narrow(base, 1, 0, 3), 0, 1);  // [3, 10], strides [1, 12]
  // Every other row and column: no unit stride in either dim, so gemm copies it.
  const Tensor strided = raw::slice(raw::slice(base, 0, 0, 10, 2), 1, 0, 8, 2);  // [5, 4], strides [24, 2]
  ASSERT_NE(at.stride(1), 1);
  ASSERT_NE(strided.stride(0), 1);
  ASSERT_NE(strided.stride(1), 1);
  const Tensor b = random({10, 5}, DType::f64, 6);
  expect_close(matmul(at, b).to_vector<double>(), naive_matmul(raw::contiguous(at), b), 1e-13);
  expect_close(matmul(b.transpose(0, 1), raw::contiguous(raw::narrow(base, 1, 0, 3))).to_vector<double>(),
               naive_matmul(raw::contiguous(b.transpose(0, 1)), raw::contiguous(raw::narrow(base, 1, 0, 3))), 1e-13);
  const Tensor c = random({4, 3}, DType::f64, 8);
  expect_close(matmul(strided, c).to_vector<double>(), naive_matmul(raw::contiguous(strided), c), 1e-13);
  // An operand broadcast inside the matrix (stride 0 rows) is copied too.
  const Tensor row = random({1, 4}, DType::f64, 9);
  expect_close(matmul(raw::expand(row, {3, 4}), c).to_vector<double>(),
               naive_matmul(raw::contiguous(raw::expand(row, {3, 4})), c), 1e-13);
  // Half-type path with a transposed operand.
  const Tensor h = raw::to(base, DType::f16);
  const Tensor ht = raw::transpose(raw::narrow(h, 1, 0, 3), 0, 1);
  expect_close(matmul(ht, raw::to(b, DType::f16)).to_vector<double>(),
               naive_matmul(raw::to(raw::contiguous(ht), DType::f64), raw::to(raw::to(b, DType::f16), DType::f64)),
               2e-3);
}

TEST(Matmul, MixedDtypesPromote) {
  Tensor a = random({2, 3}, DType::f16).requires_grad_();
  Tensor b = random({3, 2}, DType::f32).requires_grad_();
  const Tensor out = matmul(a, b);
  EXPECT_EQ(out.dtype(), DType::f32);
  sum(out).backward();
  EXPECT_EQ(a.grad().dtype(), DType::f16);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_EQ(linear(ones({2, 3}, DType::bf16), ones({4, 3}, DType::f32), ones({4}, DType::f64)).dtype(), DType::f64);
}

TEST(Matmul, EmptyInnerDimensionGivesZeros) {
  const Tensor out = matmul(ones({2, 0}), ones({0, 3}));
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(out.to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(matmul(ones({0, 4}), ones({4, 3})).shape(), (Shape{0, 3}));
}

TEST(Linear, MatchesMatmulPlusBias) {
  const Tensor x = random({2, 3, 4}, DType::f64, 1), w = random({5, 4}, DType::f64, 2), b = random({5}, DType::f64, 3);
  const Tensor y = linear(x, w, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  expect_close(y.to_vector<double>(), (matmul(x, w.transpose(0, 1)) + b).to_vector<double>(), 1e-13);
  expect_close(linear(x, w).to_vector<double>(), matmul(x, w.transpose(0, 1)).to_vector<double>(), 1e-13);
  // A non-contiguous bias and weight.
  const Tensor wt = random({4, 5}, DType::f64, 4).transpose(0, 1);
  const Tensor bs = raw::slice(random({10}, DType::f64, 5), 0, 0, 10, 2);
  expect_close(linear(x, wt, bs).to_vector<double>(), (matmul(x, wt.transpose(0, 1)) + bs).to_vector<double>(), 1e-13);
}

TEST(Linear, EmptyBatchGivesZeroWeightGradient) {
  Tensor x = zeros({0, 4}, DType::f64).requires_grad_();
  Tensor w = random({3, 4}).requires_grad_();
  Tensor b = random({3}).requires_grad_();
  const Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  sum(y).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(12, 0.0));
  EXPECT_EQ(b.grad().to_vector<double>(), std::vector<double>(3, 0.0));
}

// ---- the GEMM entry point ----

TEST(Gemm, AlphaBetaAndTransposeFlags) {
  const Tensor a = random({2, 4, 3}, DType::f64, 1);  // read transposed: [2, 3, 4]
  const Tensor b = random({1, 5, 4}, DType::f64, 2);  // read transposed, shared by the batch: [1, 4, 5]
  const Tensor c0 = random({2, 3, 5}, DType::f64, 3);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const Tensor out = raw::clone(raw::to(c0, dtype));  // gemm writes into it: never c0 itself
    ops::GemmArgs args;
    args.transpose_a = ops::Transpose::yes;
    args.transpose_b = ops::Transpose::yes;
    args.alpha = 2.0;
    args.beta = 0.5;
    ops::gemm(out, raw::to(a, dtype), raw::to(b, dtype), args);
    const Tensor at = raw::to(raw::contiguous(raw::transpose(raw::to(a, dtype), 1, 2)), DType::f64);
    const Tensor bt =
        raw::to(raw::contiguous(raw::expand(raw::transpose(raw::to(b, dtype), 1, 2), {2, 4, 5})), DType::f64);
    const std::vector<double> ab = naive_matmul(at, bt),
                              c = raw::to(raw::to(c0, dtype), DType::f64).to_vector<double>();
    std::vector<double> want(ab.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = 2.0 * ab[i] + 0.5 * c[i];
    expect_close(out.to_vector<double>(), want, dtype == DType::f64 ? 1e-13 : dtype == DType::f32 ? 1e-6 : 1e-2);
  }
}

// Off the epilogue, the GELU's derivative is applied in place over the product gemm wrote,
// also into an output whose rows are further apart than its width.
TEST(Gemm, GeluBackwardPreActivationMultipliesByTheDerivative) {
  const Tensor a = random({1, 3, 4}, DType::f64, 1), b = random({1, 4, 5}, DType::f64, 2);
  const Tensor pre = random({1, 3, 5}, DType::f64, 3);
  const std::vector<double> product = naive_matmul(a, b), x = pre.to_vector<double>();
  std::vector<double> want(product.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = product[i] * gelu_tanh_derivative(x[i]);
  const Tensor wide = full({1, 3, 7}, std::numeric_limits<double>::quiet_NaN(), DType::f64);
  const Tensor out = raw::narrow(wide, 2, 1, 5);  // row stride 7
  ops::GemmArgs args;
  args.epilogue = ops::GemmEpilogue::gelu_backward(pre);
  ops::gemm(out, a, b, args);
  expect_close(raw::contiguous(out).to_vector<double>(), want, 1e-14);
  EXPECT_TRUE(std::isnan(raw::narrow(wide, 2, 0, 1).to_vector<double>()[0]));  // nothing outside out
  // An empty inner dimension: a zero product, times the derivative.
  ops::gemm(out, zeros({1, 3, 0}, DType::f64), zeros({1, 0, 5}, DType::f64), args);
  EXPECT_EQ(raw::contiguous(out).to_vector<double>(), std::vector<double>(15, 0.0));
}

TEST(Gemm, BetaZeroIgnoresGarbageAndEmptySumScales) {
  Tensor out = full({1, 2, 2}, std::numeric_limits<double>::quiet_NaN(), DType::f32);
  ops::gemm(out, ones({1, 2, 3}, DType::f32), ones({1, 3, 2}, DType::f32));
  EXPECT_EQ(out.to_vector<double>(), std::vector<double>(4, 3.0));
  // K = 0: out = beta * out (and zeros when beta = 0, NaN or not).
  ops::GemmArgs args;
  args.beta = 0.5;
  ops::gemm(out, ones({1, 2, 0}, DType::f32), ones({1, 0, 2}, DType::f32), args);
  EXPECT_EQ(out.to_vector<double>(), std::vector<double>(4, 1.5));
  out.fill_(std::numeric_limits<double>::quiet_NaN());
  ops::gemm(out, ones({1, 2, 0}, DType::f32), ones({1, 0, 2}, DType::f32));
  EXPECT_EQ(out.to_vector<double>(), std::vector<double>(4, 0.0));
}

// ---- errors ----

TEST(Matmul, ErrorsNameTheOpAndBothShapes) {
  expect_contains(message_of([] {
                    matmul(ones({2, 3}), ones({4, 5}));
                  }),
                  {"matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)"});
  expect_contains(message_of([] {
                    matmul(ones({2, 2, 3}), ones({3, 3, 4}));
                  }),
                  {"matmul", "[2, 2, 3]", "[3, 3, 4]", "batch dimensions [2] and [3]"});
  expect_contains(message_of([] { matmul(ones({3}), ones({4})); }), {"matmul", "[3]", "[4]", "3 != 4"});
  expect_contains(message_of([] { matmul(ones({}), ones({4})); }), {"matmul", "[]", "[4]"});
  expect_contains(message_of([] { bmm(ones({2, 3}), ones({2, 3, 4})); }), {"bmm", "[2, 3]", "[2, 3, 4]", "3-D"});
  expect_contains(message_of([] {
                    bmm(ones({2, 3, 4}), ones({3, 4, 5}));
                  }),
                  {"bmm", "[2, 3, 4]", "[3, 4, 5]", "2 != 3"});
  expect_contains(message_of([] { bmm(ones({2, 3, 4}), ones({2, 5, 6})); }), {"bmm", "4 != 5"});
  expect_contains(message_of([] { linear(ones({2, 5}), ones({3, 4})); }), {"linear", "[2, 5]", "[3, 4]", "5 != 4"});
  expect_contains(message_of([] { linear(ones({2, 4}), ones({3, 4}), ones({4})); }), {"linear", "bias", "[3]", "[4]"});
  expect_contains(message_of([] { linear(ones({2, 4}), ones({4})); }), {"linear", "weight", "[4]"});
  EXPECT_THROW(matmul(ones({2, 2}, DType::i64), ones({2, 2})), DTypeError);
}

TEST(Matmul, DifferentDevicesAreAnError) {
  MT_SKIP_WITHOUT_CUDA();
  EXPECT_THROW(matmul(ones({2, 2}), ones({2, 2}, cuda_device(0))), DeviceError);
  EXPECT_THROW(linear(ones({2, 2}), ones({2, 2}), ones({2}, cuda_device(0))), DeviceError);
  EXPECT_THROW(linear_gelu(ones({2, 2}), ones({2, 2}), ones({2}, cuda_device(0))), DeviceError);
  EXPECT_THROW(mlp_gelu(ones({2, 2}), ones({2, 2}), ones({2}), ones({2, 2}, cuda_device(0)), ones({2})), DeviceError);
}

// ---- gradients ----

TEST(Matmul, GradientOnlyForInputsThatRequireIt) {
  const Tensor a = random({2, 3, 4}, DType::f64, 1);
  Tensor b = random({4, 5}, DType::f64, 2).requires_grad_();
  const Tensor w = random({2, 3, 5}, DType::f64, 3);
  sum(matmul(a, b) * w).backward();
  EXPECT_FALSE(a.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  // dB = sum over the batch of A^T W.
  std::vector<double> want(20, 0.0);
  const std::vector<double> per = naive_matmul(raw::contiguous(raw::transpose(a, 1, 2)), w);
  for (size_t i = 0; i < per.size(); ++i) want[i % 20] += per[i];
  expect_close(b.grad().to_vector<double>(), want, 1e-13);
}

TEST(Linear, GradientOnlyForInputsThatRequireIt) {
  Tensor x = random({2, 3, 4}, DType::f64, 1).requires_grad_();
  const Tensor w = random({5, 4}, DType::f64, 2);
  Tensor b = random({5}, DType::f64, 3).requires_grad_();
  const Tensor dy = random({2, 3, 5}, DType::f64, 4);
  linear(x, w, b).backward(dy);
  EXPECT_FALSE(w.grad().defined());
  expect_close(x.grad().to_vector<double>(), matmul(dy, w).to_vector<double>(), 1e-13);
  expect_close(b.grad().to_vector<double>(), sum(dy, {0, 1}).to_vector<double>(), 1e-13);
}

// OutputValues::unread records linear and lora_linear as ever, their outputs left unwritten: from
// the same upstream gradient every gradient is the computed op's, bit for bit.
void expect_unread_output_gives_the_same_gradients(const Device& device) {
  for (const bool lora : {false, true}) {
    const auto run = [&](OutputValues values) {
      Tensor x = random({3, 5, 32}, DType::f32, 81).to(device).requires_grad_();
      Tensor w = random({48, 32}, DType::f32, 82).to(device).requires_grad_();
      Tensor a = random({4, 32}, DType::f32, 83).to(device).requires_grad_();
      Tensor b = random({48, 4}, DType::f32, 84).to(device).requires_grad_();
      const Tensor bias = random({48}, DType::f32, 85).to(device);
      const Tensor y = lora ? lora_linear(x, x, w.detach(), bias, a, b, 2.0, values) : linear(x, w, bias, values);
      EXPECT_EQ(y.shape(), (Shape{3, 5, 48}));
      y.backward(random({3, 5, 48}, DType::f32, 86).to(device));
      std::vector<std::vector<float>> grads{x.grad().to_vector<float>()};
      for (const Tensor& p : lora ? std::vector<Tensor>{a, b} : std::vector<Tensor>{w}) {
        grads.push_back(p.grad().to_vector<float>());
      }
      return grads;
    };
    const auto computed = run(OutputValues::computed), unread = run(OutputValues::unread);
    for (size_t i = 0; i < computed.size(); ++i) {
      EXPECT_EQ(unread[i], computed[i]) << (lora ? "lora_linear" : "linear") << " gradient " << i << " on "
                                        << device.str();
    }
  }
}

// Three LoRA layers reading one x, as q, k and v read a norm's output, two of their adapters
// reading x itself and one a separate h: each later layer's dx is added into the engine's
// gradient for x by its GEMM, and each adapter's dh into its own dx. x's gradient is the sum of
// dy_i W_i + scale dy_i B_i A_i over the layers reading x, h's the third adapter's alone.
std::vector<std::vector<double>> lora_layers_sharing_an_input(const Device& device, DType dtype) {
  Tensor x = random({2, 3, 8}, dtype, 91).to(device).requires_grad_();
  Tensor h = random({2, 3, 8}, dtype, 92).to(device).requires_grad_();
  Tensor loss;
  for (int i = 0; i < 3; ++i) {
    const Tensor w = random({6, 8}, dtype, 93 + i).to(device);
    const Tensor a = random({2, 8}, dtype, 96 + i).to(device), b = random({6, 2}, dtype, 99 + i).to(device);
    const Tensor dy = random({2, 3, 6}, dtype, 102 + i).to(device);
    const Tensor y = lora_linear(x, i == 2 ? h : x, w, Tensor(), a, b, 1.5);
    loss = i == 0 ? sum(mul(y, dy)) : add(loss, sum(mul(y, dy)));
  }
  loss.backward();
  return {x.grad().to(kCPU).to(DType::f64).to_vector<double>(), h.grad().to(kCPU).to(DType::f64).to_vector<double>()};
}

TEST(LoraLinear, LayersReadingOneInputAddTheirInputGradientsIntoOne) {
  const std::vector<std::vector<double>> got = lora_layers_sharing_an_input(kCPU, DType::f64);
  std::vector<double> want_x(48, 0.0), want_h(48, 0.0);
  for (int i = 0; i < 3; ++i) {
    const Tensor w = random({6, 8}, DType::f64, 93 + i), a = random({2, 8}, DType::f64, 96 + i);
    const Tensor b = random({6, 2}, DType::f64, 99 + i), dy = random({2, 3, 6}, DType::f64, 102 + i);
    const std::vector<double> base = matmul(dy, w).to_vector<double>();
    const std::vector<double> branch = mul(matmul(matmul(dy, b), a), 1.5).to_vector<double>();
    for (size_t j = 0; j < 48; ++j) {
      want_x[j] += base[j] + (i == 2 ? 0.0 : branch[j]);
      if (i == 2) want_h[j] += branch[j];
    }
  }
  expect_close(got[0], want_x, 1e-12);
  expect_close(got[1], want_h, 1e-12);
}

TEST(MatmulCuda, LoraLayersReadingOneInputAddTheirInputGradientsIntoOne) {
  MT_SKIP_WITHOUT_CUDA();
  const std::vector<std::vector<double>> cpu = lora_layers_sharing_an_input(kCPU, DType::f32);
  const std::vector<std::vector<double>> gpu = lora_layers_sharing_an_input(cuda_device(0), DType::f32);
  expect_close(gpu[0], cpu[0], 1e-5);
  expect_close(gpu[1], cpu[1], 1e-5);
}

TEST(Linear, AnUnreadOutputGivesTheSameGradients) { expect_unread_output_gives_the_same_gradients(kCPU); }
TEST(MatmulCuda, AnUnreadLinearOutputGivesTheSameGradients) {
  MT_SKIP_WITHOUT_CUDA();
  expect_unread_output_gives_the_same_gradients(cuda_device(0));
}

// x is saved only for dW and W only for dx: an in-place change to an unsaved
// input after the forward is harmless, one to a saved input is caught.
TEST(Linear, SavesOnlyWhatTheRequestedGradientsRead) {
  {
    Tensor x = random({3, 4}, DType::f64, 1).requires_grad_();
    Tensor w = random({2, 4}, DType::f64, 2);
    const Tensor y = linear(x, w);
    x.fill_(7.0);  // x was not saved: W needs no gradient
    sum(y).backward();
    expect_close(x.grad().to_vector<double>(), matmul(ones({3, 2}, DType::f64), w).to_vector<double>(), 1e-13);
  }
  {
    Tensor x = random({3, 4}, DType::f64, 1).requires_grad_();
    Tensor w = random({2, 4}, DType::f64, 2);
    const Tensor y = linear(x, w);
    w.fill_(7.0);  // W was saved for dx
    EXPECT_THROW(sum(y).backward(), Error);
  }
}

TEST(Matmul, SavesOnlyWhatTheRequestedGradientsRead) {
  Tensor a = random({3, 4}, DType::f64, 1).requires_grad_();
  Tensor b = random({4, 2}, DType::f64, 2);
  const Tensor b_copy = raw::clone(b);
  const Tensor y = matmul(a, b);
  a.fill_(1.0);  // a was not saved: b needs no gradient
  sum(y).backward();
  expect_close(a.grad().to_vector<double>(),
               matmul(ones({3, 2}, DType::f64), b_copy.transpose(0, 1)).to_vector<double>(), 1e-13);
}

// ---- CUDA ----

TEST(MatmulCuda, F64AndStridedOperandsMatchCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  const Tensor a = random({2, 7, 9}, DType::f64, 1), b = random({9, 6}, DType::f64, 2);
  // f64 through CUBLAS_COMPUTE_64F.
  expect_close(matmul(raw::to(a, gpu), raw::to(b, gpu)).to_vector<double>(), matmul(a, b).to_vector<double>(), 1e-12);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor ah = raw::to(a, dtype), bh = raw::to(b, dtype);
    const double tol = dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 2e-3 : 1e-2;
    // An operand starting one element in (2- or 4-byte aligned, not 16), transposed and batched.
    const Tensor an = raw::narrow(raw::to(ah, gpu), 2, 1, 8), bn = raw::narrow(raw::to(bh, gpu), 0, 1, 8);
    ASSERT_NE(reinterpret_cast<uintptr_t>(an.data_ptr()) % 16, 0u);
    expect_close(matmul(an, bn).to_vector<double>(),
                 matmul(raw::to(raw::narrow(ah, 2, 1, 8), DType::f64), raw::to(raw::narrow(bh, 0, 1, 8), DType::f64))
                     .to_vector<double>(),
                 tol);
    const Tensor at = raw::transpose(ah, 1, 2);  // [2, 9, 7], column-major
    expect_close(matmul(raw::to(at, gpu).transpose(1, 2), raw::to(bh, gpu)).to_vector<double>(),
                 matmul(raw::to(a, dtype), raw::to(b, dtype)).to_vector<double>(), tol);
    const Tensor strided = raw::slice(ah, 2, 0, 9, 2);  // inner stride 2: copied first
    expect_close(
        matmul(raw::to(ah, gpu).slice(2, 0, 9, 2), raw::to(raw::slice(bh, 0, 0, 9, 2), gpu)).to_vector<double>(),
        matmul(raw::to(strided, DType::f64), raw::to(raw::slice(bh, 0, 0, 9, 2), DType::f64)).to_vector<double>(), tol);
  }
}

// A linear layer's bias gradient under bf16 autocast with f32 parameters: the column sums of
// the bf16 dy, accumulated and kept in f32 (GemmEpilogue::row_sums). 2048 rows of 768 and of 100
// columns: row groups and a second pass, packed and element-wise reads; 64 rows: one pass from
// bf16 straight to f32. Against the f64 CPU sum of the same bf16 dy within 1e-5 relative: f32
// accumulation, no bf16 rounding of the sum.
TEST(MatmulCuda, BiasGradientUnderAutocastIsAnF32ColumnSumOfTheHalfGradient) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  for (const auto& [rows, out_features] :
       std::vector<std::pair<int64_t, int64_t>>{{2048, 768}, {2048, 100}, {64, 768}}) {
    const Tensor x = raw::to(random({rows, 64}, DType::f32, 3), gpu);
    const Tensor w = raw::to(random({out_features, 64}, DType::f32, 4), gpu).requires_grad_();
    const Tensor b = raw::to(random({out_features}, DType::f32, 5), gpu).requires_grad_();
    const Tensor dy = raw::to(raw::to(random({rows, out_features}, DType::f32, 6), DType::bf16), gpu);
    {
      AutocastGuard amp(DeviceType::cuda, DType::bf16);
      const Tensor y = linear(x, w, b);
      ASSERT_EQ(y.dtype(), DType::bf16);
      y.backward(dy);
    }
    ASSERT_EQ(b.grad().dtype(), DType::f32);
    const std::vector<double> want = sum(raw::to(raw::to(dy, kCPU), DType::f64), {0}).to_vector<double>();
    const std::vector<double> got = raw::to(b.grad(), DType::f64).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
          << rows << " x " << out_features << " [" << i << "]";
  }
}

TEST(MatmulCuda, AlphaBetaOnTheDevice) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  const Tensor a = random({3, 4, 5}), b = random({1, 5, 6}), c = random({3, 4, 6});
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    ops::GemmArgs args;
    args.alpha = -1.5;
    args.beta = 2.0;
    Tensor out_cpu = raw::clone(raw::to(c, dtype)), out_gpu = raw::to(raw::to(c, dtype), gpu);
    ops::gemm(out_cpu, raw::to(a, dtype), raw::to(b, dtype), args);
    ops::gemm(out_gpu, raw::to(raw::to(a, dtype), gpu), raw::to(raw::to(b, dtype), gpu), args);
    expect_close(out_gpu.to_vector<double>(), out_cpu.to_vector<double>(), dtype == DType::bf16 ? 1e-2 : 1e-5);
  }
}

// With autotuning on, each new problem below runs every candidate algorithm several times before
// its result is written: the results must still match the CPU, and an accumulating GEMM (beta 1)
// must add its product to `out` once. The shapes are this test's own, so no earlier test has
// cached an algorithm for them.
TEST(MatmulCuda, AutotunedGemmsMatchTheCpuAndAccumulateOnce) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  struct AutotuneOn {
    AutotuneOn() { backends::set_matmul_autotune(true); }
    ~AutotuneOn() { backends::set_matmul_autotune(false); }
  } autotune;
  const Tensor a = random({2, 136, 72}, DType::f64, 11), b = random({1, 72, 200}, DType::f64, 12);
  const Tensor c = random({2, 136, 200}, DType::f64, 13);
  const Tensor x = random({136, 72}, DType::f64, 14), w = random({200, 72}, DType::f64, 15);
  const Tensor bias = random({200}, DType::f64, 16);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const double tol = dtype == DType::bf16 ? 1e-2 : 1e-5;
    ops::GemmArgs args;
    args.beta = 1.0;
    Tensor out_cpu = raw::clone(raw::to(c, dtype)), out_gpu = raw::to(raw::to(c, dtype), gpu);
    ops::gemm(out_cpu, raw::to(a, dtype), raw::to(b, dtype), args);
    ops::gemm(out_gpu, raw::to(raw::to(a, dtype), gpu), raw::to(raw::to(b, dtype), gpu), args);
    expect_close(out_gpu.to_vector<double>(), out_cpu.to_vector<double>(), tol);
    const Tensor y_cpu = linear(raw::to(x, dtype), raw::to(w, dtype), raw::to(bias, dtype));
    const Tensor y_gpu =
        linear(raw::to(raw::to(x, dtype), gpu), raw::to(raw::to(w, dtype), gpu), raw::to(raw::to(bias, dtype), gpu));
    expect_close(y_gpu.to_vector<double>(), y_cpu.to_vector<double>(), tol);
  }
}

TEST(MatmulCuda, RunsOnTheCurrentStream) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  const Tensor a = random({64, 32}, DType::f32, 1), b = random({32, 48}, DType::f32, 2);
  const Tensor want = matmul(a, b);
  const cuda::Stream side = cuda::Stream::create(0);
  cuda::StreamGuard guard(side);  // a second workspace, on this stream
  const Tensor ag = raw::to(a, gpu), bg = raw::to(b, gpu);
  const Tensor got = matmul(ag, bg);
  side.synchronize();
  expect_close(got.to_vector<double>(), want.to_vector<double>(), 1e-5);
}

}  // namespace
}  // namespace mt::testing
