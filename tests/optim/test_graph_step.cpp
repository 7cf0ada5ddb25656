// CudaGraphStep: a captured training step replays the eager one bit for bit, and what a
// replay could not honour (kept tensors, host synchronisation, a changed learning rate,
// random numbers) is an error naming the fix. CUDA cases skip without a GPU; the CPU case
// checks that the step simply runs there.
#include <string>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/random.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/graph_step.h"
#include "tests/test_util.h"

namespace mt {
namespace {

// Two Linear layers with GELU, trained with fp16 autocast, a GradScaler and AdamW.
struct TinyTraining {
  Tensor w1, b1, w2, b2, x, target, loss_out;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<GradScaler> scaler;

  TinyTraining(Device device, uint64_t seed, bool autocast_copies = false) {
    Generator gen(seed);
    const TensorOptions on = TensorOptions().device(device);
    w1 = (randn({32, 16}, on, &gen) * 0.2).detach().requires_grad_();
    b1 = zeros({32}, on).requires_grad_();
    w2 = (randn({8, 32}, on, &gen) * 0.2).detach().requires_grad_();
    b2 = zeros({8}, on).requires_grad_();
    x = zeros({64, 16}, on);
    target = zeros({64, 8}, on);
    loss_out = zeros({1}, on);
    AdamWOptions options(1e-2);
    if (autocast_copies) options.autocast_copies(DType::f16);
    opt = std::make_unique<AdamW>(std::vector<Tensor>{w1, b1, w2, b2}, options);
    scaler = std::make_unique<GradScaler>(device);
  }

  void step(bool keep_grads = true) {
    opt->zero_grad(/*set_to_none=*/!keep_grads);
    Tensor loss;
    {
      AutocastGuard amp(x.device().type, DType::f16);
      const Tensor diff = sub(linear(gelu(linear(x, w1, b1)), w2, b2), target);
      loss = mean(mul(diff, diff));
    }
    scaler->scale(loss).backward();
    scaler->step(*opt);
    scaler->update();
    if (after_update) after_update(*this);
    loss_out.copy_(loss.reshape({1}));
  }
  std::function<void(TinyTraining&)> after_update;  // run inside the step, after the optimizer's

  // New data for step i, written into the same tensors.
  void load_batch(int i) {
    Generator gen(100 + static_cast<uint64_t>(i));
    x.copy_(randn({64, 16}, {}, &gen));
    target.copy_(randn({64, 8}, {}, &gen));
  }
};

std::vector<double> flat(const TinyTraining& t) {
  std::vector<double> all;
  for (const Tensor& p : {t.w1, t.b1, t.w2, t.b2}) {
    const std::vector<double> v = p.to_vector<double>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// The error of the first of warmup + 1 runs that fails (the last one captures), or "".
std::string capture_error(const std::function<void()>& step, int warmup = 1) {
  CudaGraphStep graph(cuda_device(0), step, {}, warmup);
  for (int run = 0; run <= warmup; ++run) {
    try {
      graph.run();
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  return "";
}

// `steps` steps of `eager` run eagerly beside `graphed` run by `step` on the same batches: their
// losses, each side's in order.
std::pair<std::vector<double>, std::vector<double>> side_by_side(TinyTraining& eager, TinyTraining& graphed,
                                                                 CudaGraphStep& step, int steps) {
  std::vector<double> eager_losses, graphed_losses;
  for (int i = 0; i < steps; ++i) {
    eager.load_batch(i);
    eager.step();
    eager_losses.push_back(eager.loss_out.item());
    graphed.load_batch(i);
    step.run();
    graphed_losses.push_back(graphed.loss_out.item());
  }
  return {eager_losses, graphed_losses};
}

TEST(CudaGraphStep, ReplaysGiveTheEagerStepsBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  TinyTraining eager(cuda_device(0), 7), graphed(cuda_device(0), 7);
  CudaGraphStep step(cuda_device(0), [&] { graphed.step(); }, {graphed.opt.get()});
  const auto [eager_losses, graphed_losses] = side_by_side(eager, graphed, step, 8);
  EXPECT_TRUE(step.captured());
  EXPECT_GT(step.graph_nodes(), 10u);
  EXPECT_EQ(graphed_losses, eager_losses);
  EXPECT_EQ(flat(graphed), flat(eager));
}

// Casts autocast makes while `run` runs.
uint64_t casts_in(const std::function<void()>& run) {
  const uint64_t before = autocast::cast_count();
  run();
  return autocast::cast_count() - before;
}

// TinyTraining's forward casts its 4 weights and its input x; with AdamW's copies only x.
constexpr uint64_t kWeightCasts = 4;

// With AdamWOptions::autocast_copies the captured step, like the eager ones, reads the
// optimizer's f16 copies of the weights and writes them in its update: it records no weight
// cast, and every loss and parameter equals the casting run's. Between replays the copies stay
// current: an eager step after replays takes them, a replay after eager steps reads theirs, and
// a weight edited in place between replays has its copy cast again before the next replay.
// `after_update`, when set, writes weights inside the step after the update (their copies are
// then cast again before every replay, and not taken by an eager step after one).
void expect_replays_with_copies_match_the_casting_steps(const std::function<void(TinyTraining&)>& after_update) {
  TinyTraining cast(cuda_device(0), 7), graphed(cuda_device(0), 7, /*autocast_copies=*/true);
  cast.after_update = graphed.after_update = after_update;
  CudaGraphStep step(cuda_device(0), [&] { graphed.step(); }, {graphed.opt.get()});
  const auto expect_same = [&](const std::string& when) {
    EXPECT_EQ(graphed.loss_out.item(), cast.loss_out.item()) << when;
    EXPECT_EQ(flat(graphed), flat(cast)) << when;
  };
  uint64_t cast_casts = 0, graphed_casts = 0;
  for (int i = 0; i < 6; ++i) {  // two eager warm-up steps, the capture, three replays
    cast.load_batch(i);
    graphed.load_batch(i);
    cast_casts += casts_in([&] { cast.step(); });
    graphed_casts += casts_in([&] { step.run(); });
    expect_same("side by side, step " + std::to_string(i));
  }
  ASSERT_TRUE(step.captured());
  ASSERT_EQ(cast_casts % 6, 0u);
  const uint64_t per_step = cast_casts / 6, input_casts = per_step - kWeightCasts;
  const uint64_t after_update_casts = after_update ? 2 : 0;  // the weights written after the update
  // The first eager step casts every weight (no copy yet); the second, watched, takes the
  // copies but those of weights written after the update, the capture takes every copy, and
  // the replays cast nothing on the host.
  EXPECT_EQ(graphed_casts, per_step + 2 * input_casts + after_update_casts) << "the capture must read AdamW's copies";

  // An eager step after the replays takes the copies the last replay wrote (but those of
  // weights the step writes after the update).
  cast.load_batch(6);
  graphed.load_batch(6);
  cast.step();
  EXPECT_EQ(casts_in([&] { graphed.step(); }), input_casts + after_update_casts);
  expect_same("an eager step after replays");
  // A replay after that eager step reads the copies it wrote.
  cast.load_batch(7);
  graphed.load_batch(7);
  cast.step();
  step.run();
  expect_same("a replay after an eager step");
  // Weights written between replays: prepare_replay casts their copies again.
  {
    NoGradGuard no_grad;
    for (TinyTraining* t : {&cast, &graphed}) {
      t->w1.copy_(t->w1 * 0.5);
      t->b2.copy_(t->b2 + 0.25);
    }
  }
  for (int i = 8; i < 11; ++i) {
    cast.load_batch(i);
    graphed.load_batch(i);
    cast.step();
    step.run();
    expect_same("replay " + std::to_string(i - 7) + " after weights were edited in place");
  }
}

TEST(CudaGraphStep, ReplaysReadAdamWsAutocastCopiesAndGiveTheCastingStepsBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  expect_replays_with_copies_match_the_casting_steps(nullptr);
}

// The step shrinks two weights after the update: each replay leaves their copies behind, so
// they are cast again before the next one, and an eager step after a replay casts them.
TEST(CudaGraphStep, WeightsWrittenAfterTheUpdateInsideTheStepHaveTheirCopiesCastAgain) {
  MT_SKIP_WITHOUT_CUDA();
  expect_replays_with_copies_match_the_casting_steps([](TinyTraining& t) {
    NoGradGuard no_grad;
    t.w2.copy_(t.w2 * 0.9);
    t.b1.copy_(t.b1 * 0.5);
  });
}

// A capture that nobody prepares (a bare cuda::Graph, or a CudaGraphStep not given the
// optimizer) casts the weights, and AdamW stepping inside it stops writing copies for good:
// its replays may rewrite the weights at any time, behind the host's back.
// `capture` returns how many steps it ran; the casting twin runs as many, and the two then
// take two more eager steps, bit for bit alike.
void expect_an_unprepared_capture_ends_the_copies(
    const std::function<int(TinyTraining& t, uint64_t per_step, uint64_t input_casts)>& capture) {
  TinyTraining cast(cuda_device(0), 5), t(cuda_device(0), 5, /*autocast_copies=*/true);
  cast.load_batch(0);
  t.load_batch(0);
  const uint64_t per_step = casts_in([&] { cast.step(); }), input_casts = per_step - kWeightCasts;
  cast.step();
  t.step();
  EXPECT_EQ(casts_in([&] { t.step(); }), input_casts) << "an eager step takes the copies";
  for (int ran = capture(t, per_step, input_casts); ran > 0; --ran) cast.step();
  for (int i = 1; i <= 2; ++i) {
    cast.load_batch(i);
    t.load_batch(i);
    cast.step();
    EXPECT_EQ(casts_in([&] { t.step(); }), per_step) << "no copy after the capture, step " << i;
    EXPECT_EQ(t.loss_out.item(), cast.loss_out.item()) << "step " << i;
    EXPECT_EQ(flat(t), flat(cast)) << "step " << i;
  }
}

TEST(CudaGraphStep, ABareCaptureCastsTheWeightsAndEndsTheCopies) {
  MT_SKIP_WITHOUT_CUDA();
  expect_an_unprepared_capture_ends_the_copies([](TinyTraining& t, uint64_t per_step, uint64_t) {
    cuda::Graph graph;
    EXPECT_EQ(casts_in([&] { graph.capture(cuda::current_stream(0), [&] { t.step(); }); }), per_step);
    graph.replay(cuda::current_stream(0));
    graph.replay(cuda::current_stream(0));
    return 2;
  });
}

TEST(CudaGraphStep, AStepNotGivenTheOptimizerCastsTheWeightsAndEndsTheCopies) {
  MT_SKIP_WITHOUT_CUDA();
  expect_an_unprepared_capture_ends_the_copies([](TinyTraining& t, uint64_t per_step, uint64_t input_casts) {
    CudaGraphStep without_optimizer(
        cuda_device(0), [&] { t.step(); }, /*optimizers=*/{}, /*warmup=*/1);
    EXPECT_EQ(casts_in([&] { without_optimizer.run(); }), input_casts);  // the warm-up: eager
    EXPECT_EQ(casts_in([&] { without_optimizer.run(); }), per_step);     // the capture, then a replay
    without_optimizer.run();
    return 3;
  });
}

// What a replay cannot honour is an error naming the fix; one test per case, so that a
// sanitizer report names the case. `body` runs under a CudaGraphStep with `warmup` eager runs;
// the error must contain each of `expected`, and afterwards an eager step still works.
void expect_refused(const std::function<void(TinyTraining&)>& body, const std::vector<std::string>& expected,
                    int warmup = 1) {
  TinyTraining t(cuda_device(0), 3);
  const std::string error = capture_error([&] { body(t); }, warmup);
  for (const std::string& part : expected) EXPECT_NE(error.find(part), std::string::npos) << error;
  t.opt->zero_grad(
      /*set_to_none=*/true);  // what the error tells the user: gradients a refused capture kept hold no memory
  t.step();
  EXPECT_TRUE(std::isfinite(t.loss_out.item()));
}

// Gradients set to none: backward's fresh gradients would outlive the capture. With the
// default two warm-up runs the second one, run eagerly under watch, refuses the step; with
// one, the capture refuses it and the step does not run.
TEST(CudaGraphStep, KeptGradientsAreAnErrorNamingZeroGradWithoutNone) {
  MT_SKIP_WITHOUT_CUDA();
  expect_refused([](TinyTraining& t) { t.step(/*keep_grads=*/false); },
                 {"ran as an eager step", "zero_grad(/*set_to_none=*/false)"}, /*warmup=*/2);
}

TEST(CudaGraphStep, KeptGradientsAreRefusedByTheCaptureAfterOneWarmUp) {
  MT_SKIP_WITHOUT_CUDA();
  expect_refused([](TinyTraining& t) { t.step(/*keep_grads=*/false); },
                 {"The step did not run", "hold no memory", "zero_grad(/*set_to_none=*/false)"}, /*warmup=*/1);
}

TEST(CudaGraphStep, AHostSynchronisationIsAnErrorAndTheStreamStillWorks) {
  MT_SKIP_WITHOUT_CUDA();
  expect_refused(
      [](TinyTraining& t) {
        t.step();
        (void)t.loss_out.item();
      },
      {"must not synchronise"});
}

TEST(CudaGraphStep, RandomNumbersFromTheDefaultGeneratorAreAnError) {
  MT_SKIP_WITHOUT_CUDA();
  expect_refused(
      [](TinyTraining& t) {
        t.step();
        (void)dropout(t.x, 0.5, true);
      },
      {"Philox"});
}

// A step that frees what an earlier step made (here, a tensor it keeps between steps) is
// refused by the watched warm-up step, before any graph exists.
TEST(CudaGraphStep, FreeingAnEarlierStepsTensorIsRefusedByTheWatchedWarmUp) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor previous;
  expect_refused(
      [&](TinyTraining& t) {
        t.step();
        previous = mul(t.w1, 2.0);  // made now, released by the next step's assignment
      },
      {"ran as an eager step", "released"}, /*warmup=*/2);
}

// A copy from host memory in the watched warm-up step is refused there, before a capture
// could stop halfway through the step.
TEST(CudaGraphStep, ACopyFromHostMemoryIsRefusedByTheWatchedWarmUp) {
  MT_SKIP_WITHOUT_CUDA();
  expect_refused(
      [](TinyTraining& t) {
        t.x.copy_(zeros({64, 16}));  // a CPU tensor
        t.step();
      },
      {"ran as an eager step", "from host memory"}, /*warmup=*/2);
}

// A copy from host memory would be recorded by address and re-read at every replay, after the
// host buffer is gone: refused, naming the way out.
TEST(CudaGraphStep, ACopyFromHostMemoryIsAnError) {
  MT_SKIP_WITHOUT_CUDA();
  expect_refused(
      [](TinyTraining& t) {
        t.step();
        t.x.copy_(zeros({64, 16}));  // a CPU tensor
      },
      {"from host memory", "before the capture"});
}

// AdamW reads its learning rate from device memory: a schedule may change it between
// replays, and the replays follow it exactly as eager steps do. A weight decay is baked
// into the graph: changing it is an error until reset().
TEST(CudaGraphStep, ReplaysFollowAScheduledLearningRateAndRefuseAChangedWeightDecay) {
  MT_SKIP_WITHOUT_CUDA();
  TinyTraining eager(cuda_device(0), 5), graphed(cuda_device(0), 5);
  CudaGraphStep step(
      cuda_device(0), [&] { graphed.step(); }, {graphed.opt.get()}, /*warmup=*/1);
  for (int i = 0; i < 6; ++i) {
    const double lr = 1e-2 / (1 + i);  // a decaying schedule
    eager.opt->param_groups()[0].lr = lr;
    graphed.opt->param_groups()[0].lr = lr;
    eager.load_batch(i);
    eager.step();
    graphed.load_batch(i);
    step.run();
  }
  EXPECT_TRUE(step.captured());
  EXPECT_EQ(flat(graphed), flat(eager));
  graphed.opt->param_groups()[0].weight_decay = 0.5;
  try {
    step.run();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight decay"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reset()"), std::string::npos) << e.what();
  }
  step.reset();
  step.run();  // captures again with the new decay
  EXPECT_TRUE(step.captured());
}

TEST(CudaGraphStep, OnTheCpuTheStepSimplyRuns) {
  int calls = 0;
  CudaGraphStep step(Device("cpu"), [&] { ++calls; });
  for (int i = 0; i < 5; ++i) step.run();
  EXPECT_EQ(calls, 5);
  EXPECT_FALSE(step.captured());
  // Disabled (a command-line switch), even for a CUDA device it only calls the step.
  CudaGraphStep disabled(
      cuda_device(0), [&] { ++calls; }, {}, /*warmup=*/1, /*enabled=*/false);
  for (int i = 0; i < 3; ++i) disabled.run();
  EXPECT_EQ(calls, 8);
  EXPECT_FALSE(disabled.captured());
  EXPECT_NE(error_message_of([] {
              CudaGraphStep bad(
                  Device("cpu"), [] {}, {}, 0);
            }).find("warmup"),
            std::string::npos);
}

}  // namespace
}  // namespace mt
