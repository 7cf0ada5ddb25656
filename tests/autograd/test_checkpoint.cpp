// Gradient checkpointing: exact gradients (dropout replayed), frozen inputs, nesting,
// hooks, autocast, and the errors a non-deterministic segment raises.
#include "autograd/checkpoint.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt {
namespace {

// A segment with a captured parameter, dropout, and a non-linearity: y = dropout(tanh(x W^T)) * x.
struct Segment {
  Tensor w;  // [4, 4]
  explicit Segment(uint64_t seed) {
    Generator g(seed);
    w = randn({4, 4}, DType::f32, &g).requires_grad_();
  }
  Tensor operator()(const Tensor& x) const { return mul(dropout(tanh(linear(x, w)), 0.5, /*training=*/true), x); }
};

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

struct Outcome {
  std::vector<float> loss, grad_x, grad_w, next_draw;
};

// One forward + backward, with or without checkpointing, from the same generator state.
Outcome run(bool use_checkpoint, bool x_requires_grad = true) {
  manual_seed(123);
  Segment seg(7);
  Tensor x = from_vector({0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8}, {2, 4});
  if (x_requires_grad) x.requires_grad_();
  const Tensor h = use_checkpoint ? checkpoint([&](const Tensor& t) { return seg(t); }, x) : seg(x);
  const Tensor y = seg(h);  // a second, uncheckpointed use draws more dropout masks after the segment
  const Tensor loss = sum(mul(y, y));
  loss.backward();
  Outcome r{values(loss), x_requires_grad ? values(x.grad()) : std::vector<float>{}, values(seg.w.grad()),
            values(rand({4}))};
  return r;
}

TEST(Checkpoint, GradientsAreBitIdenticalAndDropoutIsReplayed) {
  const Outcome plain = run(false), ckpt = run(true);
  EXPECT_EQ(ckpt.loss, plain.loss);
  EXPECT_EQ(ckpt.grad_x, plain.grad_x);
  EXPECT_EQ(ckpt.grad_w, plain.grad_w);
  EXPECT_EQ(ckpt.next_draw, plain.next_draw);  // the recomputation put the generator back
}

TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  const Outcome plain = run(false, /*x_requires_grad=*/false), ckpt = run(true, false);
  EXPECT_EQ(ckpt.grad_w, plain.grad_w);
  EXPECT_FALSE(plain.grad_w.empty());
}

TEST(Checkpoint, NestedSegmentsGiveTheSameGradients) {
  auto grads = [](int depth) {
    manual_seed(5);
    Segment seg(9);
    Tensor x = from_vector({0.3, -0.1, 0.2, 0.9}, {1, 4}).requires_grad_();
    std::function<Tensor(const Tensor&)> f = [&](const Tensor& t) { return seg(seg(t)); };
    if (depth >= 1) f = [&](const Tensor& t) { return seg(checkpoint([&](const Tensor& u) { return seg(u); }, t)); };
    const Tensor out = depth >= 2 ? checkpoint(f, x) : f(x);
    sum(out).backward();
    return std::make_pair(values(x.grad()), values(seg.w.grad()));
  };
  EXPECT_EQ(grads(1), grads(0));
  EXPECT_EQ(grads(2), grads(0));
}

TEST(Checkpoint, PostAccumulateHooksFireOncePerParameter) {
  Segment seg(3);
  int fired = 0;
  seg.w.register_post_accumulate_grad_hook([&](const Tensor&) { ++fired; });
  Tensor x = ones({2, 4}).requires_grad_();
  sum(checkpoint([&](const Tensor& t) { return seg(t); }, x)).backward();
  EXPECT_EQ(fired, 1);
}

TEST(Checkpoint, RecomputesUnderTheForwardsAutocastState) {
  auto grads = [](bool use_checkpoint) {
    Generator g(4);
    Tensor w = randn({8, 8}, DType::f32, &g).requires_grad_();
    Tensor x = randn({4, 8}, DType::f32, &g).requires_grad_();
    Tensor out;
    {
      AutocastGuard amp(DeviceType::cpu, DType::bf16);
      auto f = [&](const Tensor& t) { return relu(linear(t, w)); };
      out = use_checkpoint ? checkpoint(f, x) : f(x);
    }
    EXPECT_EQ(out.dtype(), DType::bf16);
    sum(cast(out, DType::f32)).backward();  // backward outside the region: recompute must restore it
    return std::make_pair(values(x.grad()), values(w.grad()));
  };
  EXPECT_EQ(grads(true), grads(false));
}

TEST(Checkpoint, ARecomputationWithAnotherShapeOrDtypeIsAnError) {
  int calls = 0;
  Tensor x = ones({2, 3}).requires_grad_();
  Tensor y = checkpoint([&](const Tensor& t) { return ++calls == 1 ? mul(t, 2.0) : slice(t, 1, 0, 2); }, x);
  std::string msg = error_message_of([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("checkpoint: the recomputation gave output 0 of shape [2, 2] f32 but the forward gave [2, 3] f32"),
            std::string::npos)
      << msg;

  calls = 0;
  Tensor z = checkpoint([&](const Tensor& t) { return ++calls == 1 ? mul(t, 2.0) : cast(t, DType::f64); }, x);
  msg = error_message_of([&] { sum(z).backward(); });
  EXPECT_NE(msg.find("of shape [2, 3] f64 but the forward gave [2, 3] f32"), std::string::npos) << msg;
}

TEST(Checkpoint, InputsChangedInPlaceAndSecondBackwardsAreCaught) {
  Tensor x = ones({3}).requires_grad_();
  Tensor base = mul(x, 1.0);  // a non-leaf input
  Tensor y = checkpoint([](const Tensor& t) { return exp(t); }, base);
  base.fill_(2.0);  // bumps the saved input's version
  const std::string msg = error_message_of([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;

  Tensor a = ones({3}).requires_grad_();
  Tensor b = checkpoint([](const Tensor& t) { return exp(t); }, a);
  Tensor loss = sum(b);
  loss.backward();
  EXPECT_NE(error_message_of([&] { loss.backward(); }), "(no error)");
}

TEST(Checkpoint, UnderNoGradItJustRunsTheSegment) {
  Tensor x = ones({3}).requires_grad_();
  NoGradGuard no_grad;
  const Tensor y = checkpoint([](const Tensor& t) { return exp(t); }, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_NEAR(y.to_vector<double>()[0], std::exp(1.0), 1e-6);
}

// in_checkpointed_segment(): on in the first pass and in the recomputation, off outside them and
// under NoGradGuard (where checkpoint just calls the function).
TEST(Checkpoint, SaysWhenASegmentIsRunning) {
  std::vector<bool> seen, recomputing;
  const auto segment = [&](const Tensor& t) {
    seen.push_back(in_checkpointed_segment());
    recomputing.push_back(in_recomputation());
    return exp(t);
  };
  EXPECT_FALSE(in_checkpointed_segment());
  Tensor x = ones({3}).requires_grad_();
  Tensor y = checkpoint(segment, x);
  EXPECT_FALSE(in_checkpointed_segment());
  sum(y).backward();
  {
    NoGradGuard no_grad;
    checkpoint(segment, x);
  }
  EXPECT_EQ(seen, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(recomputing, (std::vector<bool>{false, true, false}));
  EXPECT_FALSE(in_checkpointed_segment());
  const std::string msg =
      error_message_of([&] { checkpoint([](const Tensor&) -> Tensor { throw Error("inside"); }, x); });
  EXPECT_EQ(msg, "inside");
  EXPECT_FALSE(in_checkpointed_segment()) << "an exception leaves the segment";
}

// A segment nested in another's recomputation runs its own first pass there: its outputs are read.
TEST(Checkpoint, OnlyTheInnermostPassCountsAsTheRecomputation) {
  std::vector<bool> outer, inner;
  const auto inner_segment = [&](const Tensor& t) {
    inner.push_back(in_recomputation());
    return exp(t);
  };
  const auto outer_segment = [&](const Tensor& t) {
    outer.push_back(in_recomputation());
    return checkpoint(inner_segment, t);
  };
  Tensor x = ones({3}).requires_grad_();
  sum(checkpoint(outer_segment, x)).backward();
  EXPECT_EQ(outer, (std::vector<bool>{false, true}));
  EXPECT_EQ(inner, (std::vector<bool>{false, false, true}));  // its first passes, then its own recomputation
  EXPECT_FALSE(in_recomputation());
}

// A segment called under NoGradGuard inside a recomputation just runs: its outputs are read.
TEST(Checkpoint, ASegmentCalledWithoutGradInARecomputationIsNotOne) {
  std::vector<bool> inner;
  const auto inner_segment = [&](const Tensor& t) {
    inner.push_back(in_recomputation());
    return exp(t);
  };
  const auto outer_segment = [&](const Tensor& t) {
    {
      NoGradGuard no_grad;
      checkpoint(inner_segment, t);
    }
    return exp(t);
  };
  Tensor x = ones({3}).requires_grad_();
  sum(checkpoint(outer_segment, x)).backward();
  EXPECT_EQ(inner, (std::vector<bool>{false, false}));
}

TEST(Checkpoint, IntegerOutputsAreRejected) {
  Tensor x = ones({3}).requires_grad_();
  const std::string msg =
      error_message_of([&] { checkpoint([](const Tensor& t) { return cast(t.detach(), DType::i64); }, x); });
  EXPECT_NE(msg.find("checkpoint: output 0 is i64"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mt
