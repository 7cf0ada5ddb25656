// Modules: names, modes, placement, freezing and state round trips.
#include <cstdio>

#include "autograd/autocast.h"
#include "core/view.h"
#include "ops/nn/layers.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

class TwoLayer : public Module {
 public:
  TwoLayer() {
    register_module("fc1", fc1, std::make_shared<Linear>(LinearOptions(4, 8)));
    norm = register_module("norm", std::make_shared<LayerNorm>(8));  // no slot: cannot be replaced
    register_module("fc2", fc2, std::make_shared<Linear>(LinearOptions(8, 2).bias(false)));
    register_buffer("steps", zeros({1}));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(relu(norm->forward(fc1->forward(x)))); }
  std::shared_ptr<Linear> fc1;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> fc2;
};

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

// A Linear whose forward is the base's plus one, to see which module the owner calls.
class ShiftedLinear : public Linear {
 public:
  ShiftedLinear() : Linear(LinearOptions(4, 8)) {}
  Tensor forward(const Tensor& x) const override { return add(Linear::forward(x), 1.0); }
};

TEST(Module, ReplaceModuleRepointsTheOwnersMember) {
  TwoLayer m;
  auto shifted = std::make_shared<ShiftedLinear>();
  m.replace_module("fc1", shifted);
  EXPECT_EQ(m.fc1.get(), shifted.get());
  EXPECT_EQ(m.named_children()[0].second.get(), shifted.get());
  EXPECT_EQ(m.named_parameters()[0].second.impl(), shifted->weight.impl());
}

TEST(Module, ReplaceModuleRejectsWrongTypesMissingNamesAndSlotlessChildren) {
  TwoLayer m;
  auto* before = m.fc1.get();
  EXPECT_NE(error_message_of([&] {
              m.replace_module("fc1", std::make_shared<LayerNorm>(8));
            }).find("does not derive from the type"),
            std::string::npos);
  EXPECT_EQ(m.fc1.get(), before);  // nothing changed on failure
  EXPECT_EQ(m.named_children()[0].second.get(), before);
  EXPECT_NE(
      error_message_of([&] { m.replace_module("nope", std::make_shared<LayerNorm>(8)); }).find("no child named 'nope'"),
      std::string::npos);
  EXPECT_NE(
      error_message_of([&] { m.replace_module("norm", std::make_shared<LayerNorm>(8)); }).find("without a member slot"),
      std::string::npos);
}

TEST(Module, NamedModulesListsEveryDescendantWithItsPath) {
  class Outer : public Module {
   public:
    Outer() { register_module("inner", inner, std::make_shared<TwoLayer>()); }
    std::shared_ptr<TwoLayer> inner;
  } outer;
  std::vector<std::string> paths;
  for (const auto& [path, module] : outer.named_modules()) paths.push_back(path);
  EXPECT_EQ(paths, (std::vector<std::string>{"inner", "inner.fc1", "inner.norm", "inner.fc2"}));
}

TEST(Module, NamedParametersAreDottedPathsInRegistrationOrder) {
  TwoLayer m;
  EXPECT_EQ(names(m.named_parameters()),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight"}));
  EXPECT_EQ(names(m.named_buffers()), (std::vector<std::string>{"steps"}));
  EXPECT_EQ(m.num_parameters(), 4 * 8 + 8 + 8 + 8 + 8 * 2);
  for (const Tensor& p : m.parameters()) EXPECT_TRUE(p.requires_grad() && p.is_leaf());
}

TEST(Module, DuplicateAndDottedNamesAreRejected) {
  class Bad : public Module {
   public:
    void add(const std::string& name) { register_parameter(name, zeros({1})); }
  } bad;
  bad.add("w");
  EXPECT_THROW(bad.add("w"), Error);
  EXPECT_THROW(bad.add("a.b"), Error);
}

TEST(Module, TrainAndEvalReachEveryChild) {
  TwoLayer m;
  m.eval();
  EXPECT_FALSE(m.is_training());
  EXPECT_FALSE(m.fc1->is_training());
  m.train();
  EXPECT_TRUE(m.norm->is_training());
}

TEST(Module, FreezingDropsGradientsAndTrainableCount) {
  TwoLayer m;
  sum(m.forward(ones({3, 4}))).backward();
  m.fc1->freeze();
  EXPECT_FALSE(m.fc1->weight.requires_grad());
  EXPECT_FALSE(m.fc1->weight.grad().defined());
  EXPECT_EQ(m.num_parameters(/*trainable_only=*/true), 8 + 8 + 8 * 2);
  EXPECT_EQ(m.trainable_parameters().size(), 3u);
}

TEST(Module, ToDtypeKeepsMemberHandlesAndRequiresGrad) {
  TwoLayer m;
  const Tensor held = m.fc1->weight;  // a handle taken before the cast
  m.to(DType::bf16);
  EXPECT_EQ(held.dtype(), DType::bf16);
  EXPECT_EQ(m.fc1->weight.dtype(), DType::bf16);
  EXPECT_TRUE(m.fc1->weight.requires_grad());
  EXPECT_EQ(m.forward(ones({2, 4}, DType::bf16)).dtype(), DType::bf16);
}

TEST(Module, StateDictRoundTripsBitExactThroughSafetensors) {
  manual_seed(1);
  TwoLayer a;
  manual_seed(2);
  TwoLayer b;
  const std::string path = ::testing::TempDir() + "/module_state.safetensors";
  a.save(path);
  b.load(path);
  const auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, t] : sa) EXPECT_EQ(t.to_vector<float>(), sb.at(name).to_vector<float>()) << name;
  const Tensor x = randn({5, 4});
  EXPECT_EQ(a.forward(x).to_vector<float>(), b.forward(x).to_vector<float>());
  std::remove(path.c_str());
}

TEST(Module, LoadStateDictNamesMissingUnexpectedAndMismatchedTensors) {
  TwoLayer m;
  std::map<std::string, Tensor> state = m.state_dict();
  state.erase("fc2.weight");
  state["extra"] = zeros({1});
  try {
    m.load_state_dict(state);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing keys: fc2.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys: extra"), std::string::npos) << msg;
  }
  m.load_state_dict(state, /*strict=*/false);  // non-strict: loads what matches
  state = m.state_dict();
  state["fc1.bias"] = zeros({9});
  try {
    m.load_state_dict(state);
    FAIL();
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fc1.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[9]"), std::string::npos) << msg;
  }
}

TEST(Module, LinearInitialisationFollowsTorchBounds) {
  Linear l(LinearOptions(100, 50));
  const std::vector<float> w = l.weight.to_vector<float>();
  for (float v : w) EXPECT_LE(std::fabs(v), 0.1f);
  EXPECT_EQ(l.bias.shape(), (Shape{50}));
}

TEST(Module, DropoutIsTheIdentityInEval) {
  Dropout d(0.5);
  const Tensor x = ones({1000});
  d.eval();
  EXPECT_EQ(sum(d.forward(x)).item(), 1000.0);
  d.train();
  EXPECT_NE(sum(d.forward(x)).item(), 1000.0);
}

// Autocast keeps its copy of a frozen weight across regions (Note [Autocast cast cache]), but
// Module::to() gives the weight a new storage in place: the next region must cast that, not
// serve the copy of the old one, even when both storages are at the same version.
TEST(Module, ToGivesAFrozenWeightANewAutocastCopy) {
  Linear layer(LinearOptions(4, 3).bias(false));
  layer.weight.requires_grad_(false);
  const Tensor x = ones({2, 4}, DType::bf16);
  const auto casts_of_a_step = [&] {
    AutocastGuard amp(DeviceType::cpu, DType::bf16);
    const uint64_t before = autocast::cast_count();
    layer.forward(x);
    return autocast::cast_count() - before;
  };
  EXPECT_EQ(casts_of_a_step(), 1u);
  EXPECT_EQ(casts_of_a_step(), 0u);
  layer.to(DType::f64);
  layer.to(DType::f32);  // the same values, in a storage of its own
  EXPECT_EQ(casts_of_a_step(), 1u);
}

TEST(Module, ToDeviceMovesEveryTensor) {
  MT_SKIP_WITHOUT_CUDA();
  TwoLayer m;
  m.to(cuda_device(0));
  for (const auto& [name, t] : m.state_dict()) EXPECT_TRUE(t.is_cuda()) << name;
  EXPECT_TRUE(m.forward(ones({2, 4}, "cuda")).is_cuda());
}

}  // namespace
}  // namespace mt::nn
