// cuDNN fused attention on the GPU: against the f64 reference on the CPU, with the
// heads as strided views of a fused qkv, and dropout whose backward uses the forward's mask.
#include <cmath>
#include <string>
#include <vector>

#include "core/view.h"
#include "ops/attention/attention.h"
#include "ops/attention/attention_cudnn.h"
#include "ops/backends.h"
#include "ops/ops.h"
#include "ops/shape/join.h"
#include "tests/test_util.h"

namespace mt {
namespace {

double relative_l2(const Tensor& got, const Tensor& want) {
  return ::relative_l2(got.to_vector<double>(), want.to_vector<double>());
}

struct Case {
  DType dtype;
  bool causal;
  double tolerance;  // relative L2 against the f64 reference, output and every gradient
};

TEST(AttentionCudnn, MatchesTheF64ReferenceForwardAndBackward) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu("cuda");
  for (const Case& c : {Case{DType::bf16, false, 2e-2}, Case{DType::bf16, true, 2e-2}, Case{DType::f16, false, 4e-3},
                        Case{DType::f16, true, 4e-3}}) {
    Generator gen(3);
    // B=2, H=4, T=128, D=64; q, k, v as views of one [B, T, 3C] tensor, as a transformer makes them.
    const Tensor qkv = randn({2, 128, 3 * 256}, DType::f64, &gen);
    const Tensor grad_out = randn({2, 4, 128, 64}, DType::f64, &gen);
    auto heads = [](const Tensor& t, int64_t i) {
      return t.slice(2, i * 256, (i + 1) * 256).reshape({2, 128, 4, 64}).transpose(1, 2);
    };

    const Tensor ref_qkv = qkv.detach().requires_grad_();
    const Tensor ref = scaled_dot_product_attention(heads(ref_qkv, 0), heads(ref_qkv, 1), heads(ref_qkv, 2), c.causal);
    sum(mul(ref, grad_out)).backward();

    const Tensor dev_qkv = qkv.to(c.dtype).to(gpu).detach().requires_grad_();
    const Tensor out = scaled_dot_product_attention(heads(dev_qkv, 0), heads(dev_qkv, 1), heads(dev_qkv, 2), c.causal);
    ASSERT_EQ(out.dtype(), c.dtype);
    sum(mul(out, grad_out.to(c.dtype).to(gpu))).backward();

    const double out_error = relative_l2(out.to(kCPU), ref);
    const double grad_error = relative_l2(dev_qkv.grad().to(kCPU), ref_qkv.grad());
    EXPECT_LE(out_error, c.tolerance) << dtype_name(c.dtype) << " causal " << c.causal;
    EXPECT_LE(grad_error, c.tolerance) << dtype_name(c.dtype) << " causal " << c.causal;
    std::printf("[ cudnn sdpa ] %s causal=%d: output error %.2e, qkv gradient error %.2e (tolerance %.0e)\n",
                dtype_name(c.dtype), c.causal, out_error, grad_error, c.tolerance);
  }
}

// Grouped-query attention as Llama-family models run it: q with 9 heads, k and v with 3, each
// the heads view of its own [B, T, H*D] projection, T = 100 and D = 40 (neither a power of two).
// cuDNN reads each k/v head for its 3 query heads (nothing repeated) and sums dk, dv per group:
// against the f64 reference on the CPU, output and gradients.
TEST(AttentionCudnn, GroupedQueryHeadsMatchTheF64Reference) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu("cuda");
  const int64_t B = 2, T = 100, H = 9, Hkv = 3, D = 40;
  for (const bool causal : {false, true}) {
    Generator gen(31);
    const Tensor xq = randn({B, T, H * D}, DType::f64, &gen), xk = randn({B, T, Hkv * D}, DType::f64, &gen),
                 xv = randn({B, T, Hkv * D}, DType::f64, &gen), grad_out = randn({B, H, T, D}, DType::f64, &gen);
    auto heads = [&](const Tensor& t, int64_t h) { return t.reshape({B, T, h, D}).transpose(1, 2); };
    std::vector<Tensor> ref_leaves, dev_leaves;
    for (const Tensor& t : {xq, xk, xv}) {
      ref_leaves.push_back(t.detach().requires_grad_());
      dev_leaves.push_back(t.to(DType::bf16).to(gpu).detach().requires_grad_());
    }
    const Tensor ref = scaled_dot_product_attention(heads(ref_leaves[0], H), heads(ref_leaves[1], Hkv),
                                                    heads(ref_leaves[2], Hkv), causal);
    sum(mul(ref, grad_out)).backward();
    const Tensor q = heads(dev_leaves[0], H), k = heads(dev_leaves[1], Hkv), v = heads(dev_leaves[2], Hkv);
    const std::string unsupported = ops::cudnn_sdpa_unsupported(q, k, v);
    if (!unsupported.empty()) GTEST_SKIP() << "cuDNN fused attention unavailable: " << unsupported;
    const Tensor out = scaled_dot_product_attention(q, k, v, causal);
    sum(mul(out, grad_out.to(DType::bf16).to(gpu))).backward();
    const double out_error = relative_l2(out.to(kCPU), ref);
    EXPECT_LE(out_error, 2e-2) << "causal " << causal;
    const char* names[] = {"dq", "dk", "dv"};
    for (size_t i = 0; i < 3; ++i) {
      const double error = relative_l2(dev_leaves[i].grad().to(kCPU), ref_leaves[i].grad());
      EXPECT_LE(error, 2e-2) << names[i] << " causal " << causal;
      std::printf("[ cudnn gqa ] causal=%d %s error %.2e (output %.2e; tolerance 2e-2)\n", causal, names[i], error,
                  out_error);
    }
  }
}

// Contiguous [B, H, T, D] operands (PyTorch's convention): the output and the gradients keep that
// layout (cuDNN's kernels run one layout throughout at full speed), and match the f64 reference.
TEST(AttentionCudnn, ContiguousHeadsKeepTheirLayoutAndMatchTheF64Reference) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu("cuda");
  Generator gen(5);
  const Shape shape = {2, 4, 128, 64};
  std::vector<Tensor> ref_leaves, dev_leaves;
  for (int i = 0; i < 3; ++i) {
    const Tensor t = randn(shape, DType::f64, &gen);
    ref_leaves.push_back(t.detach().requires_grad_());
    dev_leaves.push_back(t.to(DType::bf16).to(gpu).requires_grad_());
  }
  const Tensor grad_out = randn(shape, DType::f64, &gen);
  const std::string unsupported = ops::cudnn_sdpa_unsupported(dev_leaves[0], dev_leaves[1], dev_leaves[2]);
  if (!unsupported.empty()) GTEST_SKIP() << "cuDNN fused attention unavailable: " << unsupported;

  const Tensor ref = scaled_dot_product_attention(ref_leaves[0], ref_leaves[1], ref_leaves[2], true);
  sum(mul(ref, grad_out)).backward();
  const Tensor out = scaled_dot_product_attention(dev_leaves[0], dev_leaves[1], dev_leaves[2], true);
  EXPECT_TRUE(out.is_contiguous()) << "output strides " << shape_str(out.strides());
  sum(mul(out, grad_out.to(DType::bf16).to(gpu))).backward();

  EXPECT_LE(relative_l2(out.to(kCPU), ref), 2e-2) << "output";
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const Tensor g = dev_leaves[static_cast<size_t>(i)].grad();
    EXPECT_TRUE(g.is_contiguous()) << names[i] << " gradient strides " << shape_str(g.strides());
    EXPECT_LE(relative_l2(g.to(kCPU), ref_leaves[static_cast<size_t>(i)].grad()), 2e-2) << names[i] << " gradient";
  }
}

// q, k, v split from one [B, T, 3C] tensor get their gradients written by cuDNN into one
// buffer laid out as that tensor, which split's backward passes on without a copy. Against the
// same values as three separate leaves stored [B, T, C] (the same layout, so the same kernels):
// bitwise equal (deterministic backward).
TEST(AttentionCudnn, SplitQkvGradientIsBitwiseTheSeparateOperandsGradients) {
  MT_SKIP_WITHOUT_CUDA();
  const backends::DeterministicGuard deterministic;
  const TensorOptions bf16_gpu = TensorOptions().dtype(DType::bf16).device(Device("cuda"));
  Generator gen(21);
  const int64_t B = 2, T = 128, H = 4, D = 64, C = H * D;
  const Tensor qkv = randn({B, T, 3 * C}, bf16_gpu, &gen).requires_grad_();
  const Tensor grad_out = randn({B, H, T, D}, bf16_gpu, &gen);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };

  const Tensor x = mul(qkv, 1.0);  // not a leaf: a hook sees the gradient split's backward returns
  const std::vector<Tensor> pieces = split(x, C, 2);
  const Tensor q = heads(pieces[0]), k = heads(pieces[1]), v = heads(pieces[2]);
  const std::string unsupported = ops::cudnn_sdpa_unsupported(q, k, v);
  if (!unsupported.empty()) GTEST_SKIP() << "cuDNN fused attention unavailable: " << unsupported;
  Tensor dq, dx;  // what attention's backward wrote for q, and the gradient of the whole qkv
  q.register_hook([&dq](const Tensor& g) { return dq = g; });
  x.register_hook([&dx](const Tensor& g) { return dx = g; });
  const Tensor out = scaled_dot_product_attention(q, k, v, true);
  sum(mul(out, grad_out)).backward();
  ASSERT_TRUE(dq.defined() && dx.defined());
  EXPECT_TRUE(dx.shares_storage_with(dq)) << "split's backward copied the gradients";

  std::vector<Tensor> separate;  // [B, T, C] leaves
  for (const Tensor& piece : pieces) separate.push_back(piece.detach().contiguous().requires_grad_());
  const Tensor ref = scaled_dot_product_attention(heads(separate[0]), heads(separate[1]), heads(separate[2]), true);
  sum(mul(ref, grad_out)).backward();
  std::vector<Tensor> ref_grads;  // side by side
  for (const Tensor& s : separate) ref_grads.push_back(s.grad());

  EXPECT_EQ(out.to_vector<double>(), ref.to_vector<double>()) << "output";
  EXPECT_EQ(qkv.grad().to_vector<double>(), cat(ref_grads, 2).to_vector<double>()) << "qkv gradient";
}

// With v = I (Tk = D), out = dropout(P): the output shows the mask, and dv = out^T dO holds
// only if the backward dropped exactly what the forward did.
TEST(AttentionCudnn, DropoutBackwardUsesTheForwardMaskAndReplays) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu("cuda");
  Generator gen(8);
  const int64_t T = 64;
  const Tensor q = randn({1, 2, T, T}, DType::bf16, &gen).to(gpu).requires_grad_();
  const Tensor k = randn({1, 2, T, T}, DType::bf16, &gen).to(gpu).requires_grad_();
  std::vector<double> eye(static_cast<size_t>(2 * T * T), 0.0);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < T; ++i) eye[static_cast<size_t>(h * T * T + i * T + i)] = 1.0;
  const Tensor v = from_vector(eye, {1, 2, T, T}, DType::bf16).to(gpu).requires_grad_();
  const Tensor grad_out = randn({1, 2, T, T}, DType::bf16, &gen).to(gpu);

  Generator& device_generator = default_generator(gpu);
  const uint64_t offset = device_generator.offset();
  const Tensor out = scaled_dot_product_attention(q, k, v, /*causal=*/false, /*dropout_p=*/0.3);
  sum(mul(out, grad_out)).backward();

  const std::vector<double> o = out.to(kCPU).to_vector<double>();
  int64_t zeros = 0;
  for (double x : o) zeros += x == 0.0;
  EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(o.size()), 0.3, 0.03);

  // dv[h] = out[h]^T dO[h], in f64 from the bf16 values.
  const std::vector<double> d = grad_out.to(kCPU).to_vector<double>();
  const std::vector<double> dv = v.grad().to(kCPU).to_vector<double>();
  double num = 0, den = 0;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t j = 0; j < T; ++j) {
      for (int64_t c = 0; c < T; ++c) {
        double want = 0;
        for (int64_t i = 0; i < T; ++i) want += o[h * T * T + i * T + j] * d[h * T * T + i * T + c];
        const double got = dv[static_cast<size_t>(h * T * T + j * T + c)];
        num += (got - want) * (got - want), den += want * want;
      }
    }
  }
  EXPECT_LE(std::sqrt(num / den), 2e-2);

  device_generator.set_offset(offset);  // the same (seed, offset): the same mask, bit for bit
  EXPECT_EQ(scaled_dot_product_attention(q, k, v, false, 0.3).to(kCPU).to_vector<double>(), o);
  EXPECT_NE(scaled_dot_product_attention(q, k, v, false, 0.3).to(kCPU).to_vector<double>(), o);
}

}  // namespace
}  // namespace mt
