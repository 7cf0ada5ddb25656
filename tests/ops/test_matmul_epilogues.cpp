// The matmul family's fused GELU epilogues (ops/matmul): op-contract cases for linear_gelu
// (h = gelu_tanh(x W^T + b)) and mlp_gelu (y = gelu_tanh(x W1^T + b1) W2^T + b2), plus what the
// contract does not cover: equality with the unfused ops and their gradients, what each saves
// for the gradients asked for, empty shapes, error messages, and on CUDA every epilogue path and
// which GELU form (tanh or erf) cuBLASLt's GELU and DGELU epilogues compute.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/view.h"
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

// ---- linear_gelu: h = gelu_tanh(x W^T + b) ----
// 16 output columns: on CUDA in f16/bf16, one GEMM with the GELU_AUX_BIAS epilogue.
MT_OP_CASE(OpCase("linear_gelu", "linear_gelu_bias").inputs({{3, 8}, {16, 8}, {16}}).compute([](const In& x) {
  return linear_gelu(x[0], x[1], x[2]);
}));
MT_OP_CASE(OpCase("linear_gelu", "linear_gelu_3d_input").inputs({{2, 3, 4}, {8, 4}, {8}}).compute([](const In& x) {
  return linear_gelu(x[0], x[1], x[2]);
}));
// 5 output columns: the pre-activation's leading dimension is not a multiple of 8, which
// cuBLASLt's epilogue requires, so on CUDA the GEMM writes it and the GELU is a second pass.
MT_OP_CASE(OpCase("linear_gelu", "linear_gelu_columns_not_multiple_of_8")
               .inputs({{3, 4}, {5, 4}, {5}})
               .compute([](const In& x) { return linear_gelu(x[0], x[1], x[2]); }));
// Tile-sized (a GPT MLP's 4x widening): the epilogue over several tiles of 256 rows by 96 columns.
MT_OP_CASE(OpCase("linear_gelu", "linear_gelu_epilogue_sized")
               .inputs({{4, 64, 24}, {96, 24}, {96}})
               .compute([](const In& x) { return linear_gelu(x[0], x[1], x[2]); })
               .no_gradcheck("linear_gelu_bias checks the same formulas in f64; this case sizes the CUDA epilogue"));

// ---- mlp_gelu: y = gelu_tanh(x W1^T + b1) W2^T + b2 ----
// 16 hidden columns: on CUDA in f16/bf16 the forward's GELU_AUX_BIAS epilogue and the
// backward's DGELU epilogue (dpre = (dy W2) gelu_tanh'(pre) from one GEMM).
MT_OP_CASE(OpCase("mlp_gelu", "mlp_gelu_2d").inputs({{3, 8}, {16, 8}, {16}, {5, 16}, {5}}).compute([](const In& x) {
  return mlp_gelu(x[0], x[1], x[2], x[3], x[4]);
}));
MT_OP_CASE(
    OpCase("mlp_gelu", "mlp_gelu_3d_input").inputs({{2, 3, 4}, {8, 4}, {8}, {4, 8}, {4}}).compute([](const In& x) {
      return mlp_gelu(x[0], x[1], x[2], x[3], x[4]);
    }));
// 5 hidden columns: not a multiple of 8, so on CUDA neither epilogue can take the
// pre-activation; the GELU and its derivative are second passes.
MT_OP_CASE(OpCase("mlp_gelu", "mlp_gelu_hidden_not_multiple_of_8")
               .inputs({{3, 4}, {5, 4}, {5}, {3, 5}, {3}})
               .compute([](const In& x) { return mlp_gelu(x[0], x[1], x[2], x[3], x[4]); }));
// Tile-sized (a GPT MLP's 4x widening): both epilogues over several tiles of 256 rows by 96 hidden columns.
MT_OP_CASE(OpCase("mlp_gelu", "mlp_gelu_epilogue_sized")
               .inputs({{4, 64, 24}, {96, 24}, {96}, {24, 96}, {24}})
               .compute([](const In& x) { return mlp_gelu(x[0], x[1], x[2], x[3], x[4]); })
               .no_gradcheck("mlp_gelu_2d checks the same formulas in f64; this case sizes the CUDA epilogues"));

// The MLP mlp_gelu fuses, op by op.
Tensor unfused_mlp(const std::vector<Tensor>& in) {
  return linear(gelu(linear(in[0], in[1], in[2]), GeluApproximation::tanh), in[3], in[4]);
}

// x [2, 3, 4], W1 [8, 4], b1 [8], W2 [5, 8], b2 [5] in f64, and dy [2, 3, 5].
std::vector<Tensor> mlp_inputs() {
  return {random({2, 3, 4}, DType::f64, 1), random({8, 4}, DType::f64, 2), random({8}, DType::f64, 3),
          random({5, 8}, DType::f64, 4), random({5}, DType::f64, 5)};
}
const Tensor& mlp_dy() {
  static const Tensor dy = random({2, 3, 5}, DType::f64, 6);
  return dy;
}

// Fresh leaves (raw::to to the same dtype returns the tensor itself), those named requiring grad.
std::vector<Tensor> leaves(const std::vector<Tensor>& values, DType dtype, const std::vector<size_t>& trained) {
  std::vector<Tensor> out;
  for (const Tensor& t : values) out.push_back(raw::clone(raw::to(t, dtype)));
  for (size_t i : trained) out[i].requires_grad_();
  return out;
}

// Off the CUDA epilogue, linear_gelu is gelu(linear(...)) computed the same way: equal
// values and gradients, in every dtype.
TEST(LinearGelu, EqualsGeluOfLinearWithGradients) {
  const Tensor x0 = random({2, 3, 4}, DType::f64, 1), w0 = random({5, 4}, DType::f64, 2),
               b0 = random({5}, DType::f64, 3), dh = random({2, 3, 5}, DType::f64, 4);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    std::vector<std::vector<double>> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      // Fresh leaves each run (raw::to to the same dtype returns the tensor itself).
      Tensor x = raw::clone(raw::to(x0, dtype)).requires_grad_(), w = raw::clone(raw::to(w0, dtype)).requires_grad_(),
             b = raw::clone(raw::to(b0, dtype)).requires_grad_();
      const Tensor h = fused ? linear_gelu(x, w, b) : gelu(linear(x, w, b), GeluApproximation::tanh);
      ASSERT_EQ(h.shape(), (Shape{2, 3, 5}));
      ASSERT_EQ(h.dtype(), dtype);
      EXPECT_EQ(h.grad_fn()->name(), fused ? "LinearGeluBackward" : "geluBackward");
      h.backward(raw::to(dh, dtype));
      results[fused] = {h.to_vector<double>(), x.grad().to_vector<double>(), w.grad().to_vector<double>(),
                        b.grad().to_vector<double>()};
    }
    // Bit for bit: on the CPU the two run the very same GEMM and element-wise loops.
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_EQ(results[1][i], results[0][i]) << dtype_name(dtype) << ": h, dx, dW, db [" << i << "]";
    }
  }
}

// No inner dimension: h = gelu(b) for every row. No rows: an empty h and zero dW, db.
TEST(LinearGelu, EmptyInnerDimensionAndEmptyBatch) {
  const Tensor b = random({3}, DType::f64, 1);
  const Tensor h = linear_gelu(zeros({2, 0}, DType::f64), zeros({3, 0}, DType::f64), b);
  expect_close(h.to_vector<double>(),
               gelu(raw::expand(raw::unsqueeze(b, 0), {2, 3}), GeluApproximation::tanh).to_vector<double>(), 1e-15);
  Tensor x = zeros({0, 4}, DType::f64).requires_grad_();
  Tensor w = random({3, 4}).requires_grad_();
  Tensor bias = random({3}).requires_grad_();
  const Tensor y = linear_gelu(x, w, bias);
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  sum(y).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(12, 0.0));
  EXPECT_EQ(bias.grad().to_vector<double>(), std::vector<double>(3, 0.0));
}

// As linear: x is saved only for dW and W only for dx (the pre-activation always).
TEST(LinearGelu, SavesOnlyWhatTheRequestedGradientsRead) {
  Tensor x = random({3, 4}, DType::f64, 1).requires_grad_();
  const Tensor w = random({2, 4}, DType::f64, 2), b = random({2}, DType::f64, 3);
  const Tensor want = [&] {
    Tensor xc = raw::clone(x).requires_grad_();
    sum(linear_gelu(xc, w, b)).backward();
    return xc.grad();
  }();
  const Tensor y = linear_gelu(x, w, b);
  x.fill_(7.0);  // x was not saved: W needs no gradient
  sum(y).backward();
  expect_close(x.grad().to_vector<double>(), want.to_vector<double>(), 1e-15);
  Tensor w2 = raw::clone(w);
  const Tensor y2 = linear_gelu(random({3, 4}, DType::f64, 4).requires_grad_(), w2, b);
  w2.fill_(7.0);  // W was saved for dx
  EXPECT_THROW(sum(y2).backward(), Error);
}

// Off the CUDA epilogues, mlp_gelu is linear(gelu(linear(...))) computed the same way: equal
// output and five gradients, in every dtype (bit for bit: the same GEMMs and loops run).
TEST(MlpGelu, EqualsLinearOfGeluOfLinearWithGradients) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    std::vector<std::vector<double>> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      const std::vector<Tensor> in = leaves(mlp_inputs(), dtype, {0, 1, 2, 3, 4});
      const Tensor y = fused ? mlp_gelu(in[0], in[1], in[2], in[3], in[4]) : unfused_mlp(in);
      ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
      ASSERT_EQ(y.dtype(), dtype);
      EXPECT_EQ(y.grad_fn()->name(), fused ? "MlpGeluBackward" : "LinearBackward");
      y.backward(raw::to(mlp_dy(), dtype));
      results[fused].push_back(y.to_vector<double>());
      for (const Tensor& t : in) results[fused].push_back(t.grad().to_vector<double>());
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_EQ(results[1][i], results[0][i]) << dtype_name(dtype) << ": y, dx, dW1, db1, dW2, db2 [" << i << "]";
    }
  }
}

// Each input alone asks for its gradient: it gets the unfused MLP's, and no other input gets one.
TEST(MlpGelu, GradientOnlyForInputsThatRequireIt) {
  for (size_t wanted = 0; wanted < 5; ++wanted) {
    const std::vector<Tensor> in = leaves(mlp_inputs(), DType::f64, {wanted}),
                              ref = leaves(mlp_inputs(), DType::f64, {wanted});
    mlp_gelu(in[0], in[1], in[2], in[3], in[4]).backward(mlp_dy());
    unfused_mlp(ref).backward(mlp_dy());
    for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i].grad().defined(), i == wanted) << wanted << ", " << i;
    expect_close(in[wanted].grad().to_vector<double>(), ref[wanted].grad().to_vector<double>(), 1e-12);
  }
}

// h is saved only for dW2; W1 only for dx; W2 and the pre-activation only for the first
// layer's gradients: an unsaved input may change after the forward, a saved one may not.
TEST(MlpGelu, SavesOnlyWhatTheRequestedGradientsRead) {
  const std::vector<Tensor> ref = leaves(mlp_inputs(), DType::f64, {3});
  unfused_mlp(ref).backward(mlp_dy());
  const std::vector<Tensor> in = leaves(mlp_inputs(), DType::f64, {3});
  const Tensor y = mlp_gelu(in[0], in[1], in[2], in[3], in[4]);
  in[0].fill_(7.0);  // x and W1 were not saved: only W2 needs a gradient
  in[1].fill_(7.0);
  y.backward(mlp_dy());
  expect_close(in[3].grad().to_vector<double>(), ref[3].grad().to_vector<double>(), 1e-12);

  const std::vector<Tensor> in2 = leaves(mlp_inputs(), DType::f64, {0});
  const Tensor y2 = mlp_gelu(in2[0], in2[1], in2[2], in2[3], in2[4]);
  in2[3].fill_(7.0);  // W2 was saved for dx
  EXPECT_THROW(y2.backward(mlp_dy()), Error);
}

// No rows: an empty y and zero parameter gradients. No outputs: the dpre GEMM has an empty
// inner dimension, so dpre, dx and dW1 are zeros.
TEST(MlpGelu, EmptyBatchAndEmptyOutput) {
  const std::vector<Tensor> rows = leaves(
      {zeros({0, 4}, DType::f64), random({8, 4}), random({8}), random({5, 8}), random({5})}, DType::f64, {1, 2, 3, 4});
  const Tensor y = mlp_gelu(rows[0], rows[1], rows[2], rows[3], rows[4]);
  EXPECT_EQ(y.shape(), (Shape{0, 5}));
  sum(y).backward();
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].grad().to_vector<double>(), std::vector<double>(static_cast<size_t>(rows[i].numel()), 0.0));
  }
  const std::vector<Tensor> outs =
      leaves({random({2, 4}), random({8, 4}), random({8}), zeros({0, 8}, DType::f64), zeros({0}, DType::f64)},
             DType::f64, {0, 1, 2});
  const Tensor y2 = mlp_gelu(outs[0], outs[1], outs[2], outs[3], outs[4]);
  EXPECT_EQ(y2.shape(), (Shape{2, 0}));
  sum(y2).backward();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(outs[i].grad().to_vector<double>(), std::vector<double>(static_cast<size_t>(outs[i].numel()), 0.0));
  }
}

TEST(LinearGelu, ErrorsNameTheOpTheShapesAndTheDtypes) {
  expect_contains(message_of([] {
                    linear_gelu(ones({2, 5}), ones({3, 4}), ones({3}));
                  }),
                  {"linear_gelu: input [2, 5] and weight [3, 4] cannot be multiplied (in features: 5 != 4)"});
  expect_contains(message_of([] {
                    linear_gelu(ones({2, 4}), ones({3, 4}), ones({4}));
                  }),
                  {"linear_gelu: bias must have shape [3] to match weight [3, 4], got [4]"});
  expect_contains(message_of([] {
                    linear_gelu(ones({2, 4}), ones({4}), ones({4}));
                  }),
                  {"linear_gelu", "weight", "[4]"});
  expect_contains(error_message_of([] {
                    linear_gelu(ones({2, 4}), ones({3, 4}), Tensor());
                  }),
                  {"linear_gelu", "bias", "[3]", "[3, 4]"});
  const std::string dtype_msg = error_message_of([] {
    linear_gelu(ones({2, 4}, DType::i64), ones({3, 4}), ones({3}));
  });
  expect_contains(dtype_msg, {"linear_gelu", "i64[2, 4]"});
  EXPECT_THROW(linear_gelu(ones({2, 4}), ones({3, 4}, DType::i32), ones({3})), DTypeError);
}

TEST(MlpGelu, ErrorsNameTheOpTheLayerAndTheShapes) {
  const auto call = [](const Shape& x, const Shape& w1, const Shape& b1, const Shape& w2, const Shape& b2) {
    return [=] {
      mlp_gelu(ones(x), ones(w1), b1.empty() ? Tensor() : ones(b1), ones(w2), b2.empty() ? Tensor() : ones(b2));
    };
  };
  expect_contains(message_of(call({2, 5}, {8, 4}, {8}, {3, 8}, {3})),
                  {"mlp_gelu: input [2, 5] and w1 [8, 4] cannot be multiplied (in features: 5 != 4)"});
  expect_contains(message_of(call({2, 4}, {8, 4}, {8}, {3, 7}, {3})),
                  {"mlp_gelu: w2 [3, 7] takes 7 in features but w1 [8, 4] gives 8 hidden features"});
  expect_contains(message_of(call({2, 4}, {8, 4}, {7}, {3, 8}, {3})),
                  {"mlp_gelu: b1 must have shape [8] to match w1 [8, 4], got [7]"});
  expect_contains(message_of(call({2, 4}, {8, 4}, {8}, {3, 8}, {4})),
                  {"mlp_gelu: b2 must have shape [3] to match w2 [3, 8], got [4]"});
  expect_contains(message_of(call({2, 4}, {8, 4}, {8}, {8}, {3})), {"mlp_gelu: w2 must be 2-D [out, in]", "[8]"});
  expect_contains(error_message_of(call({2, 4}, {8, 4}, {}, {3, 8}, {3})), {"mlp_gelu", "b1", "[8]", "w1 [8, 4]"});
  expect_contains(error_message_of(call({2, 4}, {8, 4}, {8}, {3, 8}, {})), {"mlp_gelu", "b2", "[3]", "w2 [3, 8]"});
  EXPECT_THROW(mlp_gelu(ones({2, 4}), ones({8, 4}), ones({8}), ones({3, 8}, DType::i32), ones({3})), DTypeError);
}

// gemm() with a GELU pre-activation on the GPU, through each of its paths: the epilogue
// (96 columns), the second pass when the leading dimension breaks cuBLASLt's rule (5
// columns) or the pre-activation is not 16-byte aligned, and f32 (never the epilogue).
// Both outputs are checked: backward reads the pre-activation.
TEST(LinearGeluCuda, EveryPathWritesThePreActivationAndItsGelu) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  struct Path {
    const char* what;
    DType dtype;
    int64_t n;
    bool misaligned;
  };
  for (const Path& path :
       {Path{"epilogue", DType::bf16, 96, false}, Path{"epilogue", DType::f16, 96, false},
        Path{"ld not a multiple of 8", DType::bf16, 5, false}, Path{"misaligned pre-activation", DType::bf16, 96, true},
        Path{"f32", DType::f32, 96, false}}) {
    SCOPED_TRACE(path.what);
    const int64_t m = 64, k = 32, n = path.n;
    const Tensor x = raw::to(random({1, m, k}, DType::f64, 1), path.dtype);
    const Tensor w = raw::to(random({1, n, k}, DType::f64, 2), path.dtype);
    const Tensor b = raw::to(random({n}, DType::f64, 3), path.dtype);
    const TensorOptions options = TensorOptions().dtype(path.dtype).device(gpu);
    const Tensor out = empty({1, m, n}, options);
    // One element in: contiguous, 2-byte aligned.
    const Tensor pre = path.misaligned ? raw::view(raw::narrow(empty({m * n + 1}, options), 0, 1, m * n), {1, m, n})
                                       : empty({1, m, n}, options);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(pre.data_ptr()) % 16 != 0, path.misaligned);
    ops::GemmArgs args;
    args.transpose_b = ops::Transpose::yes;
    args.epilogue = ops::GemmEpilogue::bias_gelu(raw::to(b, gpu), pre);
    ops::gemm(out, raw::to(x, gpu), raw::to(w, gpu), args);
    // The reference from the same rounded inputs, in f64.
    const Tensor want_pre =
        linear(raw::to(x, DType::f64), raw::to(raw::squeeze(w, 0), DType::f64), raw::to(b, DType::f64));
    const double tol = path.dtype == DType::f32 ? 1e-5 : path.dtype == DType::f16 ? 2e-3 : 1e-2;
    expect_close(pre.to_vector<double>(), want_pre.to_vector<double>(), tol);
    expect_close(out.to_vector<double>(), gelu(want_pre, GeluApproximation::tanh).to_vector<double>(), tol);
  }
}

#if MT_WITH_CUDA  // gemm_cuda exists only in a CUDA build
// out [1, m, n] = a [1, m, k] @ b [1, k, n], all dense and row-major, as gemm_cuda takes it:
// the tests that ask cuBLASLt directly whether an epilogue has an algorithm.
ops::GemmProblem dense_problem(const Tensor& out, const Tensor& a, const Tensor& b) {
  const auto operand = [](const Tensor& t) {
    ops::MatrixOperand op;
    op.tensor = t;
    op.rows = t.size(1);
    op.cols = t.size(2);
    op.ld = t.size(2);
    return op;
  };
  ops::GemmProblem p;
  p.m = out.size(1);
  p.n = out.size(2);
  p.k = a.size(2);
  p.a = operand(a);
  p.b = operand(b);
  p.c = operand(out);
  return p;
}

// The GELU's input for the tests that ask which GELU an epilogue computes: x [1, m, n] in f32
// on the GPU, spread evenly over [-5, 5], where the tanh and erf forms differ most.
Tensor spread_gelu_inputs(int64_t m, int64_t n) {
  std::vector<double> xs(static_cast<size_t>(m * n));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = -5.0 + 10.0 * static_cast<double>(i) / static_cast<double>(m * n - 1);
  return raw::to(from_vector(xs, {1, m, n}, DType::f32), cuda_device(0));
}

// I [1, n, n] in f32 on the GPU: a GEMM by it passes the other operand through exactly.
Tensor identity_f32(int64_t n) {
  std::vector<double> identity(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i * n + i)] = 1.0;
  return raw::to(from_vector(identity, {1, n, n}, DType::f32), cuda_device(0));
}

double gelu_tanh_value(double x) {
  return 0.5 * x * (1 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
double gelu_erf_value(double x) { return 0.5 * x * (1 + std::erf(x * 0.70710678118654752440)); }
double gelu_erf_derivative(double x) {  // Phi(x) + x phi(x)
  return 0.5 * (1 + std::erf(x * 0.70710678118654752440)) + x * 0.39894228040143267794 * std::exp(-0.5 * x * x);
}

// How far an epilogue's out[i] is from the tanh form and from the erf form of a function at
// x[i] (summed squares, and the largest tanh-form error), printed under `what`.
struct FormErrors {
  double tanh_sq = 0, erf_sq = 0, tanh_max = 0;
};
FormErrors form_errors(const char* what, const std::vector<double>& out, const std::vector<double>& x,
                       double (*by_tanh)(double), double (*by_erf)(double)) {
  FormErrors e;
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = out[i] - by_tanh(x[i]), r = out[i] - by_erf(x[i]);
    e.tanh_sq += t * t;
    e.erf_sq += r * r;
    e.tanh_max = std::max(e.tanh_max, std::fabs(t));
  }
  const double count = static_cast<double>(x.size());
  std::printf("[ %s ] f32 over [-5, 5]: RMS error %.2e against the tanh form (max %.2e), %.2e against erf\n", what,
              std::sqrt(e.tanh_sq / count), e.tanh_max, std::sqrt(e.erf_sq / count));
  return e;
}
#endif

// Which GELU the epilogue computes, and how closely, asked of gemm_cuda directly in f32
// (gemm() keeps f32 off the epilogue). W = I and b = 0, so the pre-activation is x itself,
// spread over [-5, 5]. The backward differentiates fn::GeluTanh, so the epilogue must be
// nearer the tanh form than the erf form; the two differ by 2.2e-4 RMS over that range, far
// more than f32 rounding, and the printed errors show how accurate cuBLASLt's GELU is.
TEST(LinearGeluCuda, TheEpilogueComputesTheTanhFormOfGelu) {
  MT_SKIP_WITHOUT_CUDA();
#if MT_WITH_CUDA  // gemm_cuda exists only in a CUDA build
  const int64_t m = 64, n = 96;
  const TensorOptions f32 = TensorOptions().dtype(DType::f32).device(cuda_device(0));
  const Tensor x = spread_gelu_inputs(m, n);
  ops::GemmProblem p = dense_problem(empty({1, m, n}, f32), x, identity_f32(n));
  p.epilogue = ops::GemmEpilogue::bias_gelu(zeros({n}, f32), empty({1, m, n}, f32));
  if (!ops::gemm_cuda(p)) GTEST_SKIP() << "cuBLASLt has no f32 GELU_AUX_BIAS algorithm for this problem";
  const std::vector<double> pre = p.epilogue.pre_activation().to_vector<double>(), x32 = x.to_vector<double>();
  EXPECT_EQ(pre, x32);  // x I + 0, exactly
  const FormErrors e =
      form_errors("gelu epilogue", p.c.tensor.to_vector<double>(), x32, gelu_tanh_value, gelu_erf_value);
  EXPECT_LT(e.tanh_sq, e.erf_sq)
      << "cuBLASLt's GELU is nearer the erf form than the tanh form linear_gelu differentiates";
  EXPECT_LT(e.tanh_max, 2e-3);
#endif
}

// gemm() with the GELU's derivative on the GPU (mlp_gelu's dpre = (dy W2) gelu_tanh'(pre)),
// through each of its paths: the DGELU epilogue (96 columns, f16/bf16), the second pass when
// the leading dimension breaks cuBLASLt's rule (5 columns) or the pre-activation is not 16-byte
// aligned, and f32 (never the epilogue). On the epilogue paths gemm_cuda is also asked directly,
// so that the test fails if cuBLASLt has no DGELU algorithm there and gemm() fell back to the
// second pass without saying so.
TEST(MlpGeluCuda, EveryPathMultipliesTheProductByTheGeluDerivative) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  struct Path {
    const char* what;
    DType dtype;
    int64_t n;
    bool misaligned;
    bool epilogue;
  };
  for (const Path& path :
       {Path{"epilogue", DType::bf16, 96, false, true}, Path{"epilogue", DType::f16, 96, false, true},
        Path{"ld not a multiple of 8", DType::bf16, 5, false, false},
        Path{"misaligned pre-activation", DType::bf16, 96, true, false}, Path{"f32", DType::f32, 96, false, false}}) {
    SCOPED_TRACE(path.what);
    SCOPED_TRACE(dtype_name(path.dtype));
    const int64_t m = 64, k = 32, n = path.n;
    const Tensor dy = raw::to(random({1, m, k}, DType::f64, 1), path.dtype);
    const Tensor w = raw::to(random({1, k, n}, DType::f64, 2), path.dtype);
    const Tensor pre_values = raw::to(random({1, m, n}, DType::f64, 3), path.dtype);  // the GELU's inputs
    const TensorOptions options = TensorOptions().dtype(path.dtype).device(gpu);
    // One element in: contiguous, 2-byte aligned.
    const Tensor pre = path.misaligned ? raw::view(raw::narrow(empty({m * n + 1}, options), 0, 1, m * n), {1, m, n})
                                       : empty({1, m, n}, options);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(pre.data_ptr()) % 16 != 0, path.misaligned);
    Tensor pre_target = pre;
    pre_target.copy_(raw::to(pre_values, gpu));
    const Tensor dy_gpu = raw::to(dy, gpu), w_gpu = raw::to(w, gpu);
    const Tensor out = empty({1, m, n}, options);
    ops::GemmArgs args;
    args.epilogue = ops::GemmEpilogue::gelu_backward(pre);
    ops::gemm(out, dy_gpu, w_gpu, args);
    // The reference from the same rounded inputs, in f64.
    const std::vector<double> product = naive_matmul(raw::to(dy, DType::f64), raw::to(w, DType::f64)),
                              x = raw::to(pre_values, DType::f64).to_vector<double>();
    std::vector<double> want(product.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = product[i] * gelu_tanh_derivative(x[i]);
    const double tol = path.dtype == DType::f32 ? 1e-5 : path.dtype == DType::f16 ? 2e-3 : 1e-2;
    expect_close(out.to_vector<double>(), want, tol);
#if MT_WITH_CUDA
    if (path.epilogue) {
      ops::GemmProblem p = dense_problem(empty({1, m, n}, options), dy_gpu, w_gpu);
      p.epilogue = ops::GemmEpilogue::gelu_backward(pre);
      EXPECT_TRUE(ops::gemm_cuda(p)) << "cuBLASLt has no DGELU algorithm for this problem: gemm() ran the second pass";
      expect_close(p.c.tensor.to_vector<double>(), want, tol);
    }
#endif
  }
}

// Which derivative the DGELU epilogue computes, and how closely, asked of gemm_cuda directly
// in f32 (gemm() keeps f32 off the epilogue). dy = 1 and W = I, so the product is 1 and out is
// gelu'(x) for x spread over [-5, 5]. mlp_gelu's forward computes the tanh form (the GELU
// epilogue, or fn::GeluTanh) and the second pass differentiates it, so the epilogue must be
// nearer the tanh form's derivative than the erf form's; the printed errors show how accurate
// cuBLASLt's derivative is.
TEST(MlpGeluCuda, TheDgeluEpilogueComputesTheTanhFormsDerivative) {
  MT_SKIP_WITHOUT_CUDA();
#if MT_WITH_CUDA  // gemm_cuda exists only in a CUDA build
  const int64_t m = 64, n = 96;
  const TensorOptions f32 = TensorOptions().dtype(DType::f32).device(cuda_device(0));
  const Tensor x = spread_gelu_inputs(m, n);
  ops::GemmProblem p = dense_problem(empty({1, m, n}, f32), full({1, m, n}, 1.0, f32), identity_f32(n));
  p.epilogue = ops::GemmEpilogue::gelu_backward(x);
  const std::vector<double> x32 = x.to_vector<double>();
  if (!ops::gemm_cuda(p)) GTEST_SKIP() << "cuBLASLt has no f32 DGELU algorithm for this problem";
  EXPECT_EQ(x.to_vector<double>(), x32);  // the aux matrix is read, not written
  const FormErrors e =
      form_errors("dgelu epilogue", p.c.tensor.to_vector<double>(), x32, gelu_tanh_derivative, gelu_erf_derivative);
  EXPECT_LT(e.tanh_sq, e.erf_sq) << "cuBLASLt's DGELU is nearer the erf form's derivative than the tanh form's";
  EXPECT_LT(e.tanh_max, 5e-3);
#endif
}

}  // namespace
}  // namespace mt::testing
