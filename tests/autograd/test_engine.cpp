// The backward engine: accumulation, retain_graph, no_grad, detach, hooks, the
// errors it must raise, and deep graphs without recursion.
#include "autograd/anomaly.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Engine, GradientsAccumulateAcrossUsesAndBackwardCalls) {
  Tensor x = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
  sum(x * x + x).backward();  // d/dx = 2x + 1
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 5}));
  sum(x * 3.0).backward();  // accumulates
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6, 8}));
}

// Backward from several outputs of one node (split's pieces, or the same output twice): the node
// runs once with every root's gradient, and the leaves behind it get theirs. Each root once
// counted the node's edges again, so the leaves waited for gradients that never came.
TEST(Engine, RootsThatAreOutputsOfOneNodeReachTheLeavesBehindIt) {
  Tensor x = from_vector({1.0, 2.0, 3.0, 4.0}, {4}, DType::f64).requires_grad_();
  const std::vector<Tensor> pieces = split(x * 2.0, 2, 0);  // one SplitBackward, two outputs
  autograd::run_backward({pieces[0], pieces[1]},
                         {from_vector({1.0, 10.0}, {2}, DType::f64), from_vector({100.0, 1000.0}, {2}, DType::f64)},
                         /*retain_graph=*/false);
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 20, 200, 2000}));
  Tensor y = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
  const Tensor twice = y * 3.0;
  const Tensor ones2 = from_vector({1.0, 1.0}, {2}, DType::f64);
  autograd::run_backward({twice, twice}, {ones2, ones2}, /*retain_graph=*/false);
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{6, 6}));
}

// Two gradients for one tensor are summed in place only into a buffer nobody else
// holds: a gradient a node also keeps (here the node returns a tensor it captured)
// must come out of backward unchanged, and the sum must still be right.
TEST(Engine, GradientSumsNeverWriteIntoATensorSomeoneElseHolds) {
  for (const bool kept_first : {true, false}) {  // the node is recorded before or after the other use
    Tensor x = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
    Tensor y = x * 1.0;
    const Tensor kept = from_vector({10.0, 20.0}, {2}, DType::f64);
    Tensor other;
    if (!kept_first) other = y * 3.0;
    Tensor out = empty({2}, TensorOptions().dtype(DType::f64));
    auto node = std::make_shared<autograd::LambdaNode>(
        "ReturnsKept",
        [kept](const std::vector<Tensor>&, const autograd::LambdaNode&) { return std::vector<Tensor>{kept}; });
    autograd::record(node, {y}, {out});
    if (kept_first) other = y * 3.0;
    sum(out + other).backward();
    EXPECT_EQ(kept.to_vector<double>(), (std::vector<double>{10, 20})) << "kept_first " << kept_first;
    EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{13, 23})) << "kept_first " << kept_first;
  }
  // Three uses of one tensor: fresh gradients are summed (in place after the first copy).
  Tensor z = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
  Tensor w = z * 1.0;
  sum(w * 2.0 + w * 3.0 + w * 4.0).backward();
  EXPECT_EQ(z.grad().to_vector<double>(), (std::vector<double>{9, 9}));
}

// A node that adds into the engine's sums (Node::apply_adding: the embedding's backward) is
// handed the gradient held for its input only where it may write into it: one another node
// returned fresh, not a tensor somebody keeps, not before any has arrived, not under anomaly
// detection (which checks each node's own gradient). Either way the leaf gets the same sum.
TEST(Engine, NodesThatAddIntoSumsAreHandedOnlyGradientsNobodyElseHolds) {
  enum class Case { fresh_sum, kept_sum, nothing_yet, anomaly };
  for (const Case c : {Case::fresh_sum, Case::kept_sum, Case::nothing_yet, Case::anomaly}) {
    const int label = static_cast<int>(c);
    AnomalyGuard anomaly(c == Case::anomaly);
    Tensor x = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
    const Tensor y = x * 1.0;
    const Tensor kept = from_vector({3.0, 3.0}, {2}, DType::f64);
    bool handed = false;
    Tensor out = zeros({2}, DType::f64);  // values checked under anomaly detection
    // y's other use. Nodes run latest-made first, so one made before this node's runs after it.
    Tensor other;
    if (c == Case::nothing_yet) other = y * 3.0;
    auto node = std::make_shared<autograd::LambdaNode>(
        "AddsTen", autograd::LambdaNode::AddingFn([&handed](const std::vector<Tensor>&, const std::vector<Tensor>& sums,
                                                            const autograd::LambdaNode&) {
          const Tensor ten = from_vector({10.0, 10.0}, {2}, DType::f64);
          if (!sums[0].defined()) return std::vector<Tensor>{ten};
          handed = true;
          sums[0].copy_(sums[0] + ten);  // in place, into the engine's buffer
          return std::vector<Tensor>{sums[0]};
        }));
    autograd::record(node, {y}, {out});
    if (c == Case::kept_sum) {
      auto keeper = std::make_shared<autograd::LambdaNode>(
          "ReturnsKept",
          [kept](const std::vector<Tensor>&, const autograd::LambdaNode&) { return std::vector<Tensor>{kept}; });
      other = zeros({2}, DType::f64);
      autograd::record(keeper, {y}, {other});
    } else if (c != Case::nothing_yet) {
      other = y * 3.0;
    }
    sum(out + other).backward();
    EXPECT_EQ(handed, c == Case::fresh_sum) << "case " << label;
    EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{13, 13})) << "case " << label;
    EXPECT_EQ(kept.to_vector<double>(), (std::vector<double>{3, 3})) << "case " << label;
  }
}

TEST(Engine, SecondBackwardThroughFreedGraphSaysSo) {
  Tensor x = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward();
  const std::string msg = message_of([&] { y.backward(); });
  EXPECT_NE(msg.find("second time"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
}

TEST(Engine, RetainGraphAllowsASecondBackward) {
  Tensor x = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
  Tensor y = sum(x * x);
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 8}));
}

TEST(Engine, NonScalarBackwardWithoutGradientSaysSo) {
  Tensor x = ones({2, 3}).requires_grad_();
  const std::string msg = message_of([&] { (x * 2.0).backward(); });
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pass a gradient"), std::string::npos) << msg;
}

TEST(Engine, NonScalarBackwardWithGradient) {
  Tensor x = ones({2}).requires_grad_();
  (x * 2.0).backward(from_vector({1.0, -1.0}, {2}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, -2}));
}

TEST(Engine, BackwardOfTensorWithoutHistoryThrows) {
  const std::string msg = message_of([] { sum(ones({2})).backward(); });
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;
}

TEST(Engine, MissingBackwardThrowsInsteadOfReturningZeros) {
  Tensor x = ones({2}).requires_grad_();
  Tensor y = x * 2.0;
  Tensor out = empty({2});
  auto node = std::make_shared<autograd::LambdaNode>(
      "NoFormula",
      [](const std::vector<Tensor>&, const autograd::LambdaNode&) { return std::vector<Tensor>{Tensor()}; });
  autograd::record(node, {y}, {out});
  try {
    sum(out).backward();
    FAIL() << "expected NotImplementedError";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("NoFormula"), std::string::npos) << e.what();
  }
}

TEST(Engine, WrongGradientShapeNamesTheNodeAndBothShapes) {
  Tensor x = ones({2, 3}).requires_grad_();
  Tensor out = empty({2, 3});
  auto node =
      std::make_shared<autograd::LambdaNode>("BadShape", [](const std::vector<Tensor>&, const autograd::LambdaNode&) {
        return std::vector<Tensor>{ones({3, 2})};
      });
  autograd::record(node, {x}, {out});
  const std::string msg = message_of([&] { sum(out).backward(); });
  EXPECT_NE(msg.find("BadShape"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
}

TEST(Engine, InPlaceChangeOfASavedTensorIsCaught) {
  Tensor x = from_vector({1.0, 2.0}, {2}, DType::f64).requires_grad_();
  Tensor y = x * 2.0;
  Tensor z = sum(exp(y));  // saves exp(y)'s output
  Tensor e = exp(y);
  Tensor loss = sum(e * y);  // saves e and y
  y.fill_(0.0);              // bumps y's version
  const std::string msg = message_of([&] { loss.backward(); });
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor x = ones({2}).requires_grad_();
  Tensor y;
  {
    NoGradGuard no_grad;
    y = x * 2.0;
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE((x * 2.0).requires_grad());
}

TEST(Engine, DetachSharesDataWithoutHistory) {
  Tensor x = ones({2}).requires_grad_();
  Tensor d = (x * 2.0).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
}

TEST(Engine, OnlyRequestedGradientsAreComputed) {
  Tensor a = ones({2}).requires_grad_();
  Tensor b = ones({2});
  sum(a * b).backward();
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(Engine, TensorHooksCanReplaceGradients) {
  Tensor x = ones({2}).requires_grad_();
  Tensor y = x * 3.0;
  y.register_hook([](const Tensor& g) { return g * 10.0; });
  int leaf_hook_calls = 0;
  x.register_hook([&](const Tensor& g) {
    ++leaf_hook_calls;
    return Tensor();  // keep as is
  });
  sum(y).backward();
  EXPECT_EQ(leaf_hook_calls, 1);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{30, 30}));
}

TEST(Engine, PostAccumulateHookSeesTheAccumulatedGradient) {
  Tensor x = ones({2}).requires_grad_();
  std::vector<double> seen;
  x.register_post_accumulate_grad_hook([&](const Tensor& leaf) { seen = leaf.grad().to_vector<double>(); });
  sum(x * 4.0).backward();
  EXPECT_EQ(seen, (std::vector<double>{4, 4}));
}

TEST(Engine, DeepChainBackpropagatesAndIsDestroyedWithoutRecursion) {
  // 10,000 recorded ops in a chain (and 100,000 for teardown): a recursive walk or
  // recursive destructor would overflow the stack long before this.
  Tensor x = from_vector({1.0}, {1}, DType::f64).requires_grad_();
  {
    Tensor y = x;
    for (int i = 0; i < 10000; ++i) y = y * 1.0001;
    sum(y).backward();
    EXPECT_NEAR(x.grad().item(), std::pow(1.0001, 10000), 1e-6);
  }
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y + 1.0;
  y = Tensor();  // frees the whole graph
  SUCCEED();
}

TEST(Engine, FactoriesHonourRequiresGrad) {
  Tensor x = zeros({2}, TensorOptions().requires_grad(true));
  EXPECT_TRUE(x.requires_grad());
  Tensor r = randn({2}, TensorOptions().requires_grad(true));
  EXPECT_TRUE(r.requires_grad());
}

TEST(Engine, BackwardRunsOnTheForwardStream) {
  MT_SKIP_WITHOUT_CUDA();
  const cuda::Stream side = cuda::Stream::create(0);
  Tensor x = randn({64}, "cuda").requires_grad_();
  Tensor loss;
  {
    cuda::StreamGuard guard(side);
    loss = sum(exp(x));
  }
  std::shared_ptr<autograd::Node> fn = loss.grad_fn();
  ASSERT_TRUE(fn->has_stream);
  EXPECT_EQ(fn->stream.handle(), side.handle());
  loss.backward();
  side.synchronize();
  EXPECT_NEAR(sum(x.grad()).item(), sum(exp(x)).item(), 1e-3);
}

}  // namespace
}  // namespace mt
