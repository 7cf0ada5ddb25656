// cat / stack / split (ops/shape/join.h) and the windows their backward passes gradients
// through (ops/shape/windows.h): op-contract cases, plus behaviour the contract does not cover:
// shapes, views, gradients that are windows of one buffer, errors, and CUDA against the CPU.
#include <memory>

#include "autograd/function.h"
#include "core/view.h"
#include "ops/ops.h"
#include "ops/shape/join.h"
#include "ops/shape/windows.h"
#include "tests/ops/op_contract.h"
#include "tests/ops/ops_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

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
        std::vector<Tensor> in = {self.saved_tensor("q"), self.saved_tensor("k"), self.saved_tensor("v")};
        std::vector<Tensor> grads = ops::empty_windows_like(in);
        for (size_t j = 0; j < grads.size(); ++j) grads[j].copy_(full(in[j].shape(), static_cast<double>(j + 1)));
        written = grads.at(0);
        return grads;
      });
  node->save("q", pieces[0]);
  node->save("k", pieces[1]);
  node->save("v", pieces[2]);
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
