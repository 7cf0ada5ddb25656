// Saved-tensor rebuilding (RebuildSavedGuard, autograd/grad_mode.h): an output of SwiGLU, of
// rms_norm or of add_rms_norm that a linear layer saves for its weight gradient is kept as its
// producer's recipe, its memory freed after the forward, and rebuilt in backward, with the
// gradients of the plain run bit for bit; in a checkpointed segment too, whose recomputation runs
// under the forward's state.
#include <functional>
#include <memory>
#include <string>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt {
namespace {

// What feeds the linear layer: from two [6, 8] inputs that require grad.
using Producer = std::function<Tensor(const Tensor& a, const Tensor& b)>;

const std::vector<std::pair<std::string, Producer>>& producers() {
  static const std::vector<std::pair<std::string, Producer>> all = {
      {"swiglu", [](const Tensor& a, const Tensor& b) { return swiglu(a, b); }},
      {"rms_norm", [](const Tensor& a, const Tensor& b) { return rms_norm(mul(a, b), ones({8})); }},
      {"add_rms_norm", [](const Tensor& a, const Tensor& b) { return add_rms_norm(a, b, ones({8}), 1e-5).normed; }},
      {"rms_norm without weight", [](const Tensor& a, const Tensor& b) { return rms_norm(add(a, b), Tensor()); }},
  };
  return all;
}

struct Outcome {
  std::vector<float> loss, da, db, dw;
  bool output_freed = false;     // the producer's output was gone before backward
  std::vector<bool> rebuilding;  // is_rebuild_saved_enabled() at each run of the layer
};

// loss = sum(y * y), y = linear(produce(a, b), w), optionally as one checkpointed segment.
Outcome run(const Producer& produce, bool rebuild, bool checkpointed) {
  Generator g(11);
  Tensor a = randn({6, 8}, DType::f32, &g).requires_grad_();
  Tensor b = randn({6, 8}, DType::f32, &g).requires_grad_();
  Tensor w = randn({5, 8}, DType::f32, &g).requires_grad_();
  std::weak_ptr<Storage> output;
  Outcome o;
  const auto layer = [&](const std::vector<Tensor>& in) {
    o.rebuilding.push_back(is_rebuild_saved_enabled());
    const Tensor h = produce(in[0], in[1]);
    output = h.storage();
    return std::vector<Tensor>{linear(h, w)};  // saves h for dW
  };
  Tensor y;
  {
    const RebuildSavedGuard guard(rebuild);
    y = checkpointed ? checkpoint(layer, {a, b})[0] : layer({a, b})[0];
  }
  o.output_freed = output.expired();
  const Tensor loss = sum(mul(y, y));
  loss.backward();
  o.loss = loss.to_vector<float>();
  o.da = a.grad().to_vector<float>();
  o.db = b.grad().to_vector<float>();
  o.dw = w.grad().to_vector<float>();
  return o;
}

void expect_same_gradients(const Outcome& got, const Outcome& want, const std::string& what) {
  EXPECT_EQ(got.loss, want.loss) << what;
  EXPECT_EQ(got.da, want.da) << what;
  EXPECT_EQ(got.db, want.db) << what;
  EXPECT_EQ(got.dw, want.dw) << what;
}

TEST(RebuildSaved, ASavedOutputIsFreedAndRebuiltWithTheSameGradients) {
  for (const auto& [name, produce] : producers()) {
    const Outcome kept = run(produce, /*rebuild=*/false, /*checkpointed=*/false);
    const Outcome rebuilt = run(produce, /*rebuild=*/true, /*checkpointed=*/false);
    EXPECT_FALSE(kept.output_freed) << name << ": saved as data, the linear layer holds it";
    EXPECT_TRUE(rebuilt.output_freed) << name << ": saved as its producer's recipe, nothing holds it";
    expect_same_gradients(rebuilt, kept, name);
  }
  EXPECT_FALSE(is_rebuild_saved_enabled()) << "the guard restores the state";
}

TEST(RebuildSaved, ACheckpointedSegmentRecomputesUnderTheForwardsState) {
  for (const auto& [name, produce] : producers()) {
    const Outcome plain = run(produce, /*rebuild=*/false, /*checkpointed=*/false);
    for (const bool rebuild : {false, true}) {
      const Outcome o = run(produce, rebuild, /*checkpointed=*/true);
      expect_same_gradients(o, plain, name + (rebuild ? ", rebuilt" : ", kept"));
      // The first pass and the recomputation in backward, outside the guard, under its state.
      EXPECT_EQ(o.rebuilding, std::vector<bool>(2, rebuild)) << name;
    }
  }
}

}  // namespace
}  // namespace mt
