// LoRA layers and models: exactness at init, merge precision, rsLoRA, dropout on the branch,
// PEFT's target matching and parameter counts, gradients and optimizer state, and every error
// path of apply_lora / merge (each checked to leave the model unchanged). The adapter files and
// their config reader are in test_lora_adapter.cpp.
#include <algorithm>
#include <cmath>
#include <set>
#include <typeinfo>

#include "ops/nn/gpt.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "tests/nn/lora_test_util.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

using namespace lora_test;

// One Linear child "proj" in a slot.
class Single : public Module {
 public:
  Single(int64_t in, int64_t out, DType dtype, bool bias = true) {
    register_module("proj", proj, std::make_shared<Linear>(LinearOptions(in, out).bias(bias)));
    to(dtype);
  }
  std::shared_ptr<Linear> proj;
};

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : values(t)) m = std::max(m, std::fabs(v));
  return m;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = values(a), vb = values(b);
  EXPECT_EQ(va.size(), vb.size());
  double m = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) m = std::max(m, std::fabs(va[i] - vb[i]));
  return m;
}

// ---------------------------------------------------------------------------
// The layer

TEST(LoraLayer, LinearFromTensorsSharesStorageAndValidates) {
  const Tensor w = randn({3, 2}), b = randn({3});
  Linear l(w, b);
  EXPECT_TRUE(l.weight.shares_storage_with(w));
  EXPECT_TRUE(l.bias.shares_storage_with(b));
  EXPECT_TRUE(l.weight.requires_grad() && l.bias.requires_grad());
  EXPECT_FALSE(w.requires_grad());  // the caller's handle is left alone
  Linear no_bias(w, Tensor());
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
  EXPECT_TRUE(contains(error_message_of([] { Linear(randn({3}), Tensor()); }),
                       "weight must be a 2-D [out, in] tensor, got [3]"));
  EXPECT_TRUE(contains(error_message_of([] {
                         Linear(zeros({3, 2}, DType::i64), Tensor());
                       }),
                       "weight must be floating, got i64"));
  EXPECT_TRUE(contains(error_message_of([] {
                         Linear(randn({3, 2}), randn({2}));
                       }),
                       "bias must have shape [3] for weight [3, 2], got [2]"));
}

TEST(LoraLayer, TakesOverTheBaseTensorsFrozenWithPeftInit) {
  Single m(/*in=*/64, /*out=*/5, DType::bf16);
  const Linear& base = *m.proj;
  const LoRALinear layer(base, lora_options(4, 8, {"proj"}), "proj");
  std::vector<std::string> names;
  for (const auto& [name, t] : layer.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "lora_A.weight", "lora_B.weight"}));
  EXPECT_TRUE(layer.weight.shares_storage_with(base.weight));
  EXPECT_TRUE(layer.bias.shares_storage_with(base.bias));
  EXPECT_FALSE(layer.weight.requires_grad() || layer.bias.requires_grad());
  EXPECT_FALSE(layer.weight.grad().defined());
  EXPECT_EQ(layer.lora_A->weight.shape(), (Shape{4, 64}));
  EXPECT_EQ(layer.lora_B->weight.shape(), (Shape{5, 4}));
  EXPECT_FALSE(layer.lora_A->bias.defined() || layer.lora_B->bias.defined());
  EXPECT_EQ(layer.lora_A->weight.dtype(), DType::f32);  // trained in f32 over the bf16 base
  EXPECT_EQ(layer.lora_B->weight.dtype(), DType::f32);
  EXPECT_EQ(layer.scale(), 2.0);
  EXPECT_FALSE(layer.merged());
  const std::vector<double> a = values(layer.lora_A->weight);
  for (double v : a) EXPECT_LE(std::fabs(v), 1.0 / 8.0);  // U(-1/sqrt(64), 1/sqrt(64))
  EXPECT_GT(max_abs(layer.lora_A->weight), 1.0 / 16.0);   // spread over the range, not zeros
  EXPECT_EQ(max_abs(layer.lora_B->weight), 0.0);
}

// A bf16 base outside autocast: the f32 factors train in f32, and the layer's output keeps the
// base's dtype, as without adapters (the next bf16 op takes it).
TEST(LoraLayer, HalfBaseOutsideAutocastKeepsItsOutputDtypeAndTrainsF32Factors) {
  Single m(/*in=*/8, /*out=*/4, DType::bf16);
  apply_lora(m, lora_options(2, 4, {"proj"}));
  const LoRALinear& layer = dynamic_cast<const LoRALinear&>(*m.proj);
  layer.lora_B->weight.detach().fill_(0.5);
  const Tensor x = randn({3, 8}, DType::bf16);
  const Tensor y = layer.forward(x);
  EXPECT_EQ(y.dtype(), DType::bf16);
  sum(y).backward();
  EXPECT_EQ(layer.lora_A->weight.grad().dtype(), DType::f32);
  EXPECT_GT(max_abs(layer.lora_A->weight.grad()), 0.0);
}

TEST(LoraLayer, InvalidOptionsAreRejected) {
  Single m(4, 3, DType::f32);
  LoRAOptions o = lora_options(0, 8, {"proj"});
  EXPECT_TRUE(
      contains(error_message_of([&] { LoRALinear(*m.proj, o, "proj"); }), "LoRALinear: r must be positive, got 0"));
  o.r = 2;
  o.alpha = INFINITY;
  EXPECT_TRUE(contains(error_message_of([&] { apply_lora(m, o); }), "apply_lora: alpha must be finite, got inf"));
  o.alpha = 8;
  o.dropout = 1;
  EXPECT_TRUE(contains(error_message_of([&] { apply_lora(m, o); }), "dropout must lie in [0, 1), got 1"));
  EXPECT_TRUE(lora_layers(m).empty());
}

// Note [LoRA merge precision]: W = 1, scale * (B A) = 2^-8 + 2^-16. In f32 the sum is
// exact and rounds once to bf16's 1 + 2^-7. Rounding the product to bf16 first gives
// 2^-8 (a tie, to even), and 1 + 2^-8 then ties back down to 1: the update is lost.
TEST(LoraLayer, MergeComputesInF32AndRoundsOnceIntoBf16) {
  Single m(/*in=*/1, /*out=*/1, DType::bf16, /*bias=*/false);
  m.proj->weight.fill_(1.0);
  apply_lora(m, lora_options(/*r=*/2, /*alpha=*/2, {"proj"}));  // scale 1
  LoRALinear& layer = dynamic_cast<LoRALinear&>(*m.proj);
  layer.lora_A->weight.copy_(from_vector({std::ldexp(1.0, -8), std::ldexp(1.0, -16)}, {2, 1}));
  layer.lora_B->weight.copy_(from_vector({1.0, 1.0}, {1, 2}));
  layer.merge();
  EXPECT_EQ(layer.weight.dtype(), DType::bf16);
  EXPECT_EQ(values(layer.weight), std::vector<double>{1.0078125});
  layer.unmerge();  // 1 + 2^-7 - (2^-8 + 2^-16) = 1 + 2^-8 - 2^-16 rounds to 1
  EXPECT_EQ(values(layer.weight), std::vector<double>{1.0});
}

TEST(LoraLayer, RsLoraScalesByAlphaOverSqrtR) {
  Single m(6, 5, DType::f64);
  LoRAOptions o = lora_options(/*r=*/4, /*alpha=*/8, {"proj"});
  o.use_rslora = true;
  apply_lora(m, o);
  randomize_b(m);
  const auto& layer = dynamic_cast<const LoRALinear&>(*m.proj);
  EXPECT_EQ(layer.scale(), 4.0);  // 8 / sqrt(4), where plain LoRA has 8 / 4
  const Tensor x = randn({3, 6}, DType::f64);
  const Tensor branch = linear(linear(x, layer.lora_A->weight), layer.lora_B->weight);  // [3, 5]
  const Tensor difference = sub(m.proj->forward(x), linear(x, layer.weight, layer.bias));
  EXPECT_GT(max_abs(branch), 1e-3);
  EXPECT_LE(max_abs_diff(difference, branch * 4.0), 1e-12 * max_abs(difference));
  EXPECT_GT(max_abs_diff(difference, branch * 2.0), 1e-3 * max_abs(difference));
}

TEST(LoraLayer, DropoutActsOnTheBranchInputOnlyWhileTraining) {
  Single m(16, 8, DType::f64);
  LoRAOptions o = lora_options(4, 8, {"proj"});
  o.dropout = 0.5;
  apply_lora(m, o);
  auto& layer = dynamic_cast<LoRALinear&>(*m.proj);
  const Tensor x = randn({4, 16}, DType::f64);
  const Tensor base = linear(x, layer.weight, layer.bias);
  EXPECT_EQ(values(layer.forward(x)), values(base));  // training, but B = 0: exactly the base
  randomize_b(m);

  m.eval();
  const Tensor y_eval = layer.forward(x);
  layer.merge();
  const Tensor y_merged = layer.forward(x);
  layer.unmerge();
  EXPECT_LE(max_abs_diff(y_eval, y_merged), 1e-12 * max_abs(y_eval));

  m.train();
  manual_seed(7);
  const Tensor y_train = layer.forward(x);
  manual_seed(7);
  const Tensor kept = dropout(x, 0.5, /*training=*/true);  // the same mask
  const Tensor expected = add(base, linear(linear(kept, layer.lora_A->weight), layer.lora_B->weight) * 2.0);
  EXPECT_LE(max_abs_diff(y_train, expected), 1e-12 * max_abs(expected));
  EXPECT_GT(max_abs_diff(y_train, y_eval), 1e-6);
}

// ---------------------------------------------------------------------------
// Models

TEST(LoraModel, AtInitTheOutputIsBitwiseTheBaseOutput) {
  for (DType dtype : {DType::f32, DType::f64}) {
    Tiny m(1, dtype);
    const Tensor x = randn({5, 8}, dtype);
    const std::vector<double> before = values(m.forward(x));
    const auto names_before = m.state_dict();
    EXPECT_EQ(apply_lora(m, lora_options(4, 8, kAllLinears)),
              (std::vector<std::string>{"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
    EXPECT_EQ(values(m.forward(x)), before);  // B = 0: y + scale * 0 is y, bit for bit
    for (const auto& [name, t] : names_before) EXPECT_TRUE(m.state_dict().count(name)) << name;  // names kept
    EXPECT_EQ(m.state_dict().size(), names_before.size() + 8);
  }
}

TEST(LoraModel, TargetsFollowPeftMatching) {
  Tiny m(1);
  // A name matches a whole last component: "proj" does not match "attn.c_proj".
  EXPECT_EQ(apply_lora(m, lora_options(2, 4, {"c_proj", "proj"})),
            (std::vector<std::string>{"attn.c_proj", "mlp.c_proj"}));
  Tiny full(1);
  EXPECT_EQ(apply_lora(full, lora_options(2, 4, {"mlp.c_fc"})), (std::vector<std::string>{"mlp.c_fc"}));
  Tiny regex(1);
  LoRAOptions o = lora_options(2, 4, {});
  o.target_regex = R"(attn\.c_.*)";  // must match the whole path
  EXPECT_EQ(apply_lora(regex, o), (std::vector<std::string>{"attn.c_attn", "attn.c_proj"}));
  EXPECT_TRUE(dynamic_cast<LoRALinear*>(regex.attn->c_attn.get()));  // the owner's member points at it
}

TEST(LoraModel, MergedAndUnmergedOutputsAgreeAndUnmergeRestoresTheWeights) {
  // f32: max |diff| <= 1e-5 * max |y| (a few roundings of the merged weight, 8-32 term sums);
  // f64: 1e-12 * max |y|.
  for (const auto& [dtype, tolerance] : {std::pair{DType::f32, 1e-5}, std::pair{DType::f64, 1e-12}}) {
    Tiny m(3, dtype);
    apply_lora(m, lora_options(4, 8, kAllLinears));
    randomize_b(m, 0.5);
    m.eval();
    const Tensor x = randn({6, 8}, dtype);
    const Tensor y = m.forward(x);
    std::map<std::string, Tensor> weights;
    for (const auto& [path, layer] : lora_layers(m)) weights[path] = layer->weight.clone();

    merge_lora(m);
    const Tensor y_merged = m.forward(x);
    EXPECT_LE(max_abs_diff(y, y_merged), tolerance * max_abs(y)) << dtype_name(dtype);
    EXPECT_GT(max_abs_diff(weights["attn.c_attn"], m.attn->c_attn->weight), 1e-3);  // the update is in W
    std::map<std::string, Tensor> merged;
    for (const auto& [path, layer] : lora_layers(m)) merged[path] = layer->weight.clone();

    unmerge_lora(m);
    // W'' = fl(fl(W + d) - d) = W + e1 + e2 with |e1| <= u |W'|, |e2| <= u |W''|.
    const double u = dtype == DType::f32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
    for (const auto& [path, layer] : lora_layers(m)) {
      const std::vector<double> w = values(weights[path]), w1 = values(merged[path]), w2 = values(layer->weight);
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_LE(std::fabs(w2[i] - w[i]), u * (std::fabs(w1[i]) + std::fabs(w2[i]))) << path << " " << i;
    }
    EXPECT_LE(max_abs_diff(y, m.forward(x)), tolerance * max_abs(y));
  }
}

TEST(LoraModel, MergeStateErrorsNameTheLayer) {
  Tiny m(3);
  apply_lora(m, lora_options(4, 8, kAllLinears));
  auto& layer = dynamic_cast<LoRALinear&>(*m.attn->c_attn);
  EXPECT_EQ(error_message_of([&] { layer.unmerge(); }), "LoRALinear::unmerge: 'attn.c_attn' is not merged");
  EXPECT_TRUE(contains(error_message_of([&] { unmerge_lora(m); }), "unmerge_lora: 'attn.c_attn' is not merged"));
  layer.merge();
  EXPECT_TRUE(contains(error_message_of([&] { layer.merge(); }), "LoRALinear::merge: 'attn.c_attn' is already merged"));
  const Snapshot before = snapshot(m);
  EXPECT_TRUE(contains(error_message_of([&] { merge_lora(m); }), "merge_lora: 'attn.c_attn' is already merged"));
  EXPECT_TRUE(contains(error_message_of([&] { unmerge_lora(m); }), "unmerge_lora: 'attn.c_proj' is not merged"));
  EXPECT_EQ(snapshot(m), before);  // neither changed a layer
  Tiny plain(3);
  EXPECT_EQ(error_message_of([&] { merge_lora(plain); }), "merge_lora: the model has no LoRA layers");
  EXPECT_EQ(error_message_of([&] { unmerge_lora(plain); }), "unmerge_lora: the model has no LoRA layers");
}

TEST(LoraModel, OnlyAdaptersReceiveGradientsAndOptimizerState) {
  Tiny m(5);
  apply_lora(m, lora_options(4, 8, {"c_attn", "c_fc"}));
  const auto layers = lora_layers(m);
  ASSERT_EQ(layers.size(), 2u);
  sum(m.forward(randn({3, 8}))).backward();
  for (const auto& [name, p] : m.named_parameters()) {
    const bool adapter = contains(name, ".lora_A.") || contains(name, ".lora_B.");
    EXPECT_EQ(p.requires_grad(), adapter) << name;
    EXPECT_EQ(p.grad().defined(), adapter) << name;  // base W, b and LayerNorm: no gradient buffer
  }
  for (const auto& [path, layer] : layers) {
    EXPECT_EQ(max_abs(layer->lora_A->weight.grad()), 0.0) << path;  // dA = scale B^T dy x = 0 while B = 0
    EXPECT_GT(max_abs(layer->lora_B->weight.grad()), 0.0) << path;
  }

  AdamW opt(m.trainable_parameters(), AdamWOptions(1e-2));
  size_t count = 0;
  for (const ParamGroup& g : opt.param_groups()) count += g.params.size();
  EXPECT_EQ(count, 2 * layers.size());
  const Snapshot before = snapshot(m);
  opt.step();
  for (size_t i = 0; i < count; ++i) EXPECT_TRUE(opt.state(0, i).exp_avg.defined());
  const Snapshot after = snapshot(m);
  for (const auto& [name, entry] : before.params) {
    const bool adapter = contains(name, ".lora_A.") || contains(name, ".lora_B.");
    // A moves by AdamW's decoupled weight decay (its gradient is zero), B by its gradient.
    EXPECT_EQ(entry.first != after.params.at(name).first, adapter) << name;
  }
}

TEST(LoraModel, TrainableParametersSummaryMatchesPeft) {
  // Base: c_attn 8*24+24 = 216, attn.c_proj 24*8+8 = 200, ln 8+8 = 16, c_fc 8*32+32 = 288,
  // mlp.c_proj 32*8 = 256 (no bias): 976. LoRA r = 4 on the three c_proj/c_attn layers:
  // attn.c_attn 4*8 + 24*4 = 128, attn.c_proj 4*24 + 8*4 = 128, mlp.c_proj 4*32 + 8*4 = 160: 416.
  // 416 / 1392 = 29.885057...%.
  Tiny m(1);
  EXPECT_EQ(trainable_parameters_summary(m), "trainable params: 976 || all params: 976 || trainable%: 100.0000");
  apply_lora(m, lora_options(4, 8, {"c_attn", "c_proj"}));
  EXPECT_EQ(trainable_parameters_summary(m), "trainable params: 416 || all params: 1,392 || trainable%: 29.8851");

  // 1024 * 1024 + 1024 = 1,049,600 base; r = 8: 8 * 1024 * 2 = 16,384; 16384 / 1065984 = 1.536984%.
  Single big(1024, 1024, DType::f32);
  apply_lora(big, lora_options(8, 16, {"proj"}));
  EXPECT_EQ(trainable_parameters_summary(big),
            "trainable params: 16,384 || all params: 1,065,984 || trainable%: 1.5370");
  big.freeze();
  EXPECT_EQ(trainable_parameters_summary(big), "trainable params: 0 || all params: 1,065,984 || trainable%: 0.0000");
  Module empty;
  EXPECT_EQ(error_message_of([&] { trainable_parameters_summary(empty); }),
            "trainable_parameters_summary: the model has no parameters");
}

// PEFT on Hugging Face's gpt2 with LoraConfig(r=8, target_modules=["c_attn"]) prints this
// line: 12 layers * (8 * 768 + 2304 * 8) = 294,912 over 124,439,808 + 294,912 (wte tied).
TEST(LoraModel, Gpt2SmallMatchesPeftsPrintedCounts) {
  GPT gpt(GPTConfig{});
  const std::vector<std::string> paths = apply_lora(gpt, lora_options(8, 16, {"c_attn"}));
  ASSERT_EQ(paths.size(), 12u);
  EXPECT_EQ(paths.front(), "transformer.h.0.attn.c_attn");
  EXPECT_EQ(trainable_parameters_summary(gpt),
            "trainable params: 294,912 || all params: 124,734,720 || trainable%: 0.2364");
}

// A Linear whose own forward differs from Linear's.
class ShiftedLinear : public Linear {
 public:
  ShiftedLinear() : Linear(LinearOptions(4, 4)) {}
  Tensor forward(const Tensor& x) const override { return add(Linear::forward(x), 1.0); }
};

TEST(LoraModel, ApplyLoraErrorsLeaveTheModelUnchanged) {
  Tiny m(2);
  const Snapshot before = snapshot(m);
  auto expect_error = [&](const LoRAOptions& o, const std::string& part) {
    const std::string msg = error_message_of([&] { apply_lora(m, o); });
    EXPECT_TRUE(contains(msg, part)) << msg;
    EXPECT_TRUE(snapshot(m) == before) << part;
  };
  expect_error(lora_options(4, 8, {"q_proj", "v_proj"}),
               "apply_lora: no module matches the targets [q_proj, v_proj]; the model's modules include: attn, "
               "attn.c_attn, attn.c_proj, ln, mlp, mlp.c_fc, mlp.c_proj");
  expect_error(lora_options(4, 8, {"c_attn", "ln"}),
               "apply_lora: 'ln' matches the targets [c_attn, ln] but is not a Linear");
  expect_error(lora_options(4, 8, {"attn"}), "'attn' matches the targets [attn] but is not a Linear");
  expect_error(lora_options(4, 8, {}), "apply_lora: give target_modules or target_regex (exactly one)");
  expect_error(lora_options(4, 8, {"c_fc", ""}), "apply_lora: a target module name is empty");
  LoRAOptions both = lora_options(4, 8, {"c_fc"});
  both.target_regex = ".*";
  expect_error(both, "give target_modules or target_regex (exactly one), got 1 target module names and a regex");
  LoRAOptions bad_regex = lora_options(4, 8, {});
  bad_regex.target_regex = "(c_attn";
  expect_error(bad_regex, "apply_lora: target_regex '(c_attn' is not a valid regex");
  LoRAOptions whole = lora_options(4, 8, {});
  whole.target_regex = "c_attn";  // a regex must match the whole path, "attn.c_attn"
  expect_error(whole, "no module matches the targets regex 'c_attn'");
  expect_error(lora_options(-1, 8, {"c_fc"}), "apply_lora: r must be positive, got -1");

  apply_lora(m, lora_options(4, 8, {"c_fc"}));
  const Snapshot once = snapshot(m);
  EXPECT_TRUE(contains(error_message_of([&] { apply_lora(m, lora_options(4, 8, {"c_attn"})); }),
                       "apply_lora: the model already has LoRA layers (mlp.c_fc); apply_lora runs once per model"));
  EXPECT_TRUE(snapshot(m) == once);

  class WithSubclass : public Module {
   public:
    WithSubclass() { register_module<Linear>("shifted", shifted, std::make_shared<ShiftedLinear>()); }
    std::shared_ptr<Linear> shifted;
  } sub;
  EXPECT_TRUE(contains(error_message_of([&] { apply_lora(sub, lora_options(2, 4, {"shifted"})); }),
                       "apply_lora: 'shifted' matches the targets [shifted] but is a subclass of Linear"));
  const Linear& still = *sub.shifted;
  EXPECT_EQ(typeid(still), typeid(ShiftedLinear));
}

TEST(LoraModel, AFailedReplacementIsRolledBack) {
  HalfSlotted m;
  const Linear* head = m.head.get();
  const Snapshot before = snapshot(m);
  const std::string msg = error_message_of([&] { apply_lora(m, lora_options(2, 4, {"head", "fc"})); });
  EXPECT_TRUE(contains(msg, "apply_lora: cannot put a LoRALinear at 'fc'")) << msg;
  EXPECT_TRUE(contains(msg, "without a member slot")) << msg;
  EXPECT_TRUE(contains(msg, "the model was left unchanged")) << msg;
  EXPECT_EQ(m.head.get(), head);
  EXPECT_EQ(m.named_children()[0].second.get(), head);
  EXPECT_TRUE(snapshot(m) == before);
}

}  // namespace
}  // namespace mt::nn
