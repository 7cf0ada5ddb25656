// LoRA: exactness at init, merge precision, gradients and optimizer state, PEFT
// adapter files, and every error path (each checked to leave the model unchanged).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/safetensors.h"
#include "ops/nn/gpt.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A GPT-2 shaped toy: attn.c_attn, attn.c_proj, ln, mlp.c_fc, mlp.c_proj (no bias).
class Attn : public Module {
 public:
  Attn() {
    register_module("c_attn", c_attn, std::make_shared<Linear>(LinearOptions(8, 24)));
    register_module("c_proj", c_proj, std::make_shared<Linear>(LinearOptions(24, 8)));
  }
  Tensor forward(const Tensor& x) const { return c_proj->forward(gelu(c_attn->forward(x))); }
  std::shared_ptr<Linear> c_attn, c_proj;
};

class Mlp : public Module {
 public:
  Mlp() {
    register_module("c_fc", c_fc, std::make_shared<Linear>(LinearOptions(8, 32)));
    register_module("c_proj", c_proj, std::make_shared<Linear>(LinearOptions(32, 8).bias(false)));
  }
  Tensor forward(const Tensor& x) const { return c_proj->forward(gelu(c_fc->forward(x))); }
  std::shared_ptr<Linear> c_fc, c_proj;
};

class Tiny : public Module {
 public:
  explicit Tiny(uint64_t seed, DType dtype = DType::f32) {
    manual_seed(seed);
    register_module("attn", attn, std::make_shared<Attn>());
    register_module("ln", ln, std::make_shared<LayerNorm>(8));
    register_module("mlp", mlp, std::make_shared<Mlp>());
    to(dtype);
  }
  Tensor forward(const Tensor& x) const { return mlp->forward(ln->forward(add(x, attn->forward(x)))); }  // [N, 8]
  std::shared_ptr<Attn> attn;
  std::shared_ptr<LayerNorm> ln;
  std::shared_ptr<Mlp> mlp;
};

// One Linear child "proj" in a slot.
class Single : public Module {
 public:
  Single(int64_t in, int64_t out, DType dtype, bool bias = true) {
    register_module("proj", proj, std::make_shared<Linear>(LinearOptions(in, out).bias(bias)));
    to(dtype);
  }
  std::shared_ptr<Linear> proj;
};

LoRAOptions lora_options(int64_t r, double alpha, std::vector<std::string> targets) {
  LoRAOptions o;
  o.r = r;
  o.alpha = alpha;
  o.target_modules = std::move(targets);
  return o;
}

const std::vector<std::string> kAllLinears = {"c_attn", "c_proj", "c_fc"};

void randomize_b(Module& model, double stddev = 0.1) {
  for (const auto& [path, layer] : lora_layers(model))
    layer->lora_B->weight.copy_(randn(layer->lora_B->weight.shape()) * stddev);
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

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

// Every parameter's values and requires_grad, and the module paths: what "unchanged" means.
struct Snapshot {
  std::map<std::string, std::pair<std::vector<double>, bool>> params;
  std::vector<std::string> lora_paths;
  bool operator==(const Snapshot& o) const { return params == o.params && lora_paths == o.lora_paths; }
};

Snapshot snapshot(const Module& m) {
  Snapshot s;
  for (const auto& [name, t] : m.named_parameters()) s.params[name] = {values(t), t.requires_grad()};
  for (const auto& [path, layer] : lora_layers(m)) s.lora_paths.push_back(path);
  return s;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/lora_" + name;
  fs::remove_all(dir);
  return dir;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

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
  EXPECT_EQ(layer.lora_A->weight.dtype(), DType::bf16);
  EXPECT_EQ(layer.lora_B->weight.dtype(), DType::bf16);
  EXPECT_EQ(layer.scale(), 2.0);
  EXPECT_FALSE(layer.merged());
  const std::vector<double> a = values(layer.lora_A->weight);
  for (double v : a) EXPECT_LE(std::fabs(v), 1.0 / 8.0);  // U(-1/sqrt(64), 1/sqrt(64))
  EXPECT_GT(max_abs(layer.lora_A->weight), 1.0 / 16.0);   // spread over the range, not zeros
  EXPECT_EQ(max_abs(layer.lora_B->weight), 0.0);
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

// "head" has a member slot, "fc" has none: the first replacement succeeds, the second
// cannot, and the first must be undone.
class HalfSlotted : public Module {
 public:
  HalfSlotted() {
    register_module("head", head, std::make_shared<Linear>(LinearOptions(4, 4)));
    fc = register_module("fc", std::make_shared<Linear>(LinearOptions(4, 4)));
  }
  std::shared_ptr<Linear> head, fc;
};

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

// ---------------------------------------------------------------------------
// Adapter files

// A Tiny with LoRA r = 4, alpha = 8 on every Linear, B random, saved to `dir`.
std::unique_ptr<Tiny> saved_adapter(const std::string& dir, const AdapterSaveOptions& save = {}) {
  auto m = std::make_unique<Tiny>(11);
  apply_lora(*m, lora_options(4, 8, {"c_proj", "c_fc", "c_attn"}));
  randomize_b(*m);
  save_adapter(*m, dir, save);
  return m;
}

TEST(LoraAdapter, SavedAndLoadedIntoAFreshModelGivesBitwiseOutputs) {
  const std::string dir = fresh_dir("round_trip");
  AdapterSaveOptions save;
  save.fan_in_fan_out = true;
  save.base_model_name_or_path = "gpt2";
  const auto a = saved_adapter(dir, save);
  Tiny b(11);  // the same base weights
  load_adapter(b, dir);
  const Tensor x = randn({4, 8});
  a->eval();
  b.eval();
  EXPECT_EQ(values(b.forward(x)), values(a->forward(x)));
  EXPECT_TRUE(snapshot(b) == snapshot(*a));  // values, names and requires_grad

  const SafetensorsFile file = load_safetensors(dir + "/adapter_model.safetensors");
  std::set<std::string> keys;
  for (const auto& [key, t] : file.tensors) keys.insert(key);
  std::set<std::string> expected;
  for (const char* path : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
    for (const char* factor : {"lora_A", "lora_B"})
      expected.insert(std::string("base_model.model.") + path + "." + factor + ".weight");
  }
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(file.tensors.at("base_model.model.attn.c_attn.lora_B.weight").shape(), (Shape{24, 4}));
  EXPECT_EQ(file.metadata.at("format"), "pt");

  const Json config = Json::parse(read_text(dir + "/adapter_config.json"));
  const Json want = {{"peft_type", "LORA"},
                     {"task_type", "CAUSAL_LM"},
                     {"r", 4},
                     {"lora_alpha", 8},
                     {"lora_dropout", 0.0},
                     {"target_modules", {"c_attn", "c_fc", "c_proj"}},
                     {"use_rslora", false},
                     {"bias", "none"},
                     {"fan_in_fan_out", true},
                     {"base_model_name_or_path", "gpt2"},
                     {"inference_mode", true},
                     {"init_lora_weights", true},
                     {"modules_to_save", nullptr},
                     {"layers_to_transform", nullptr},
                     {"layers_pattern", nullptr},
                     {"rank_pattern", Json::object()},
                     {"alpha_pattern", Json::object()},
                     {"use_dora", false},
                     {"revision", nullptr}};
  EXPECT_EQ(config, want) << config.dump(2);
  EXPECT_TRUE(config.at("lora_alpha").is_number_integer());  // PEFT writes an int
}

TEST(LoraAdapter, LoadsIntoAModelThatHasLoraAndConvertsDtypes) {
  const std::string dir = fresh_dir("existing");
  const auto a = saved_adapter(dir);
  Tiny b(11, DType::f64);
  apply_lora(b, lora_options(4, 8, {"c_attn", "c_fc", "c_proj"}));  // same targets, another order
  load_adapter(b, dir);
  for (const auto& [path, layer] : lora_layers(b)) {
    EXPECT_EQ(layer->lora_A->weight.dtype(), DType::f64) << path;
    EXPECT_EQ(layer->lora_B->weight.dtype(), DType::f64) << path;
  }
  const auto la = lora_layers(*a), lb = lora_layers(b);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_EQ(values(lb[i].second->lora_A->weight), values(la[i].second->lora_A->weight)) << lb[i].first;
    EXPECT_EQ(values(lb[i].second->lora_B->weight), values(la[i].second->lora_B->weight)) << lb[i].first;
  }
}

TEST(LoraAdapter, RegexTargetsRoundTripAsAString) {
  const std::string dir = fresh_dir("regex");
  Tiny a(4);
  LoRAOptions o = lora_options(2, 4, {});
  o.target_regex = R"(.*\.c_proj)";
  o.use_rslora = true;
  o.dropout = 0.1;
  apply_lora(a, o);
  randomize_b(a);
  AdapterSaveOptions save;
  save.task_type = "";
  save_adapter(a, dir, save);
  const Json config = Json::parse(read_text(dir + "/adapter_config.json"));
  EXPECT_EQ(config.at("target_modules"), R"(.*\.c_proj)");
  EXPECT_EQ(config.at("use_rslora"), true);
  EXPECT_EQ(config.at("lora_dropout"), 0.1);
  EXPECT_TRUE(config.at("task_type").is_null());
  EXPECT_TRUE(config.at("base_model_name_or_path").is_null());
  Tiny b(4);
  load_adapter(b, dir);
  const auto layers = lora_layers(b);
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].second->options().target_regex, R"(.*\.c_proj)");
  EXPECT_EQ(layers[0].second->options().dropout, 0.1);
  EXPECT_EQ(layers[0].second->scale(), 4 / std::sqrt(2.0));
  a.eval();
  b.eval();
  const Tensor x = randn({2, 8});
  EXPECT_EQ(values(b.forward(x)), values(a.forward(x)));
}

TEST(LoraAdapter, SaveErrorsNameTheProblem) {
  const std::string dir = fresh_dir("save_errors");
  Tiny plain(1);
  EXPECT_EQ(error_message_of([&] { save_adapter(plain, dir); }),
            "save_adapter: the model has no LoRA layers (apply_lora first)");

  Tiny m(1);
  apply_lora(m, lora_options(4, 8, {"c_attn"}));
  merge_lora(m);
  const std::string merged = error_message_of([&] { save_adapter(m, dir); });
  EXPECT_TRUE(contains(merged, "save_adapter: 'attn.c_attn' is merged")) << merged;
  EXPECT_TRUE(contains(merged, "count it twice")) << merged;
  unmerge_lora(m);

  // A second layer with another rank, put in by hand.
  m.mlp->replace_module("c_fc", std::make_shared<LoRALinear>(*m.mlp->c_fc, lora_options(2, 8, {"c_fc"}), "mlp.c_fc"));
  const std::string mixed = error_message_of([&] { save_adapter(m, dir); });
  EXPECT_TRUE(contains(mixed,
                       "save_adapter: 'mlp.c_fc' has r = 2, alpha = 8, use_rslora = false, targets [c_fc] but "
                       "'attn.c_attn' has r = 4"))
      << mixed;
  EXPECT_TRUE(contains(mixed, "one adapter file holds one configuration")) << mixed;
  EXPECT_FALSE(fs::exists(dir));  // nothing written by any failed save

  const std::string file = fresh_dir("a_file");
  write_text(file, "x");
  Tiny ok(1);
  apply_lora(ok, lora_options(4, 8, {"c_attn"}));
  const std::string blocked = error_message_of([&] { save_adapter(ok, file + "/sub"); });
  EXPECT_TRUE(contains(blocked, "save_adapter: " + file + "/sub: cannot create the directory")) << blocked;
}

// Each case edits a valid adapter (config JSON, tensors, or the raw config text) and
// names the file and the words the error must contain.
struct LoadCase {
  std::string label;
  std::function<void(Json& config, std::map<std::string, Tensor>& tensors)> edit;
  std::string raw_config;  // replaces the config text when non-empty
  bool blame_config;       // the error names adapter_config.json, else adapter_model.safetensors
  std::string expected;
};

std::vector<LoadCase> load_cases() {
  const std::string a_key = "base_model.model.attn.c_attn.lora_A.weight";
  const std::string b_key = "base_model.model.attn.c_attn.lora_B.weight";
  auto config = [](std::function<void(Json&)> f) { return [f](Json& c, std::map<std::string, Tensor>&) { f(c); }; };
  auto tensors = [](std::function<void(std::map<std::string, Tensor>&)> f) {
    return [f](Json&, std::map<std::string, Tensor>& t) { f(t); };
  };
  auto none = [](Json&, std::map<std::string, Tensor>&) {};
  return {
      {"malformed", none, "{ \"r\": 4,", true, "malformed JSON"},
      {"not_object", none, "[1, 2]", true, "expected a JSON object, got array"},
      {"peft_type", config([](Json& c) { c["peft_type"] = "PREFIX_TUNING"; }), "", true,
       "peft_type is PREFIX_TUNING, expected \"LORA\""},
      {"no_peft_type", config([](Json& c) { c.erase("peft_type"); }), "", true, "peft_type is missing"},
      {"r_zero", config([](Json& c) { c["r"] = 0; }), "", true, "r must be a positive integer, got 0"},
      {"r_float", config([](Json& c) { c["r"] = 4.5; }), "", true, "r must be a positive integer, got 4.5"},
      {"alpha", config([](Json& c) { c["lora_alpha"] = "16"; }), "", true, "lora_alpha must be a number, got \"16\""},
      {"dropout", config([](Json& c) { c["lora_dropout"] = 1.5; }), "", true,
       "lora_dropout must be a number in [0, 1)"},
      {"rslora", config([](Json& c) { c["use_rslora"] = "yes"; }), "", true, "use_rslora must be a boolean"},
      {"targets_null", config([](Json& c) { c["target_modules"] = nullptr; }), "", true,
       "target_modules is missing or null"},
      {"targets_empty", config([](Json& c) { c["target_modules"] = Json::array(); }), "", true,
       "target_modules must be a non-empty list of strings or a string"},
      {"targets_number", config([](Json& c) { c["target_modules"] = {1}; }), "", true,
       "target_modules must hold non-empty strings, got 1"},
      {"targets_no_match", config([](Json& c) { c["target_modules"] = {"q_proj"}; }), "", true,
       "apply_lora: no module matches the targets [q_proj]"},
      {"bias_all", config([](Json& c) { c["bias"] = "all"; }), "", true, "bias is \"all\"; only \"none\" is supported"},
      {"dora", config([](Json& c) { c["use_dora"] = true; }), "", true, "use_dora is true, which is not supported"},
      {"rank_pattern", config([](Json& c) {
         c["rank_pattern"] = {{"c_fc", 2}};
       }),
       "", true, "rank_pattern is {\"c_fc\":2}, which is not supported"},
      {"modules_to_save", config([](Json& c) { c["modules_to_save"] = {"lm_head"}; }), "", true,
       "modules_to_save is [\"lm_head\"], which is not supported"},
      {"r_mismatch", config([](Json& c) { c["r"] = 8; }), "", false,
       "'base_model.model.attn.c_attn.lora_A.weight' has shape [4, 8] in the file but [8, 8] in the model"},
      {"missing_key", tensors([=](auto& t) { t.erase(b_key); }), "", false,
       "missing key 'base_model.model.attn.c_attn.lora_B.weight'; keys found that the model does not expect: none"},
      {"default_names", tensors([=](auto& t) {
         t["base_model.model.attn.c_attn.lora_A.default.weight"] = t.at(a_key);
         t.erase(a_key);
       }),
       "", false,
       "missing key 'base_model.model.attn.c_attn.lora_A.weight'; keys found that the model does not expect: "
       "base_model.model.attn.c_attn.lora_A.default.weight (keys with the adapter name, '.default.'"},
      {"unexpected_key", tensors([](auto& t) {
         t["base_model.model.ln.lora_A.weight"] = zeros({4, 8});
       }),
       "", false, "unexpected key 'base_model.model.ln.lora_A.weight': the model has no LoRA weight of that name"},
      {"shape", tensors([=](auto& t) {
         t[b_key] = zeros({24, 3});
       }),
       "", false,
       "'base_model.model.attn.c_attn.lora_B.weight' has shape [24, 3] in the file but [24, 4] in the model"},
      {"int_dtype", tensors([=](auto& t) {
         t[b_key] = zeros({24, 4}, DType::i64);
       }),
       "", false, "'base_model.model.attn.c_attn.lora_B.weight' has dtype i64; adapter weights must be floating"},
  };
}

TEST(LoraAdapter, LoadErrorsNameTheFileAndLeaveTheModelUnchanged) {
  const std::string good = fresh_dir("good");
  saved_adapter(good);
  const Json config = Json::parse(read_text(good + "/adapter_config.json"));
  const std::map<std::string, Tensor> tensors = load_safetensors(good + "/adapter_model.safetensors").tensors;
  Tiny m(11);
  const Snapshot before = snapshot(m);
  for (const LoadCase& c : load_cases()) {
    const std::string dir = fresh_dir("bad_" + c.label);
    fs::create_directories(dir);
    Json edited_config = config;
    std::map<std::string, Tensor> edited_tensors = tensors;
    c.edit(edited_config, edited_tensors);
    write_text(dir + "/adapter_config.json", c.raw_config.empty() ? edited_config.dump(2) : c.raw_config);
    save_safetensors(dir + "/adapter_model.safetensors", edited_tensors);
    const std::string blamed = dir + (c.blame_config ? "/adapter_config.json" : "/adapter_model.safetensors");
    try {
      load_adapter(m, dir);
      ADD_FAILURE() << c.label << ": no error";
    } catch (const FileError& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, "load_adapter: " + blamed + ": ")) << c.label << ": " << msg;
      EXPECT_TRUE(contains(msg, c.expected)) << c.label << ": " << msg;
    }
    EXPECT_TRUE(snapshot(m) == before) << c.label;
  }
}

TEST(LoraAdapter, MissingDirectoryAndFilesAreNamed) {
  Tiny m(11);
  const Snapshot before = snapshot(m);
  const std::string missing = fresh_dir("missing");
  EXPECT_TRUE(
      contains(error_message_of([&] { load_adapter(m, missing); }), "load_adapter: " + missing + ": not a directory"));

  const std::string good = fresh_dir("files");
  saved_adapter(good);
  const std::string no_config = fresh_dir("no_config");
  fs::create_directories(no_config);
  fs::copy_file(good + "/adapter_model.safetensors", no_config + "/adapter_model.safetensors");
  EXPECT_TRUE(contains(error_message_of([&] { load_adapter(m, no_config); }),
                       "load_adapter: " + no_config + "/adapter_config.json: does not exist"));

  const std::string no_weights = fresh_dir("no_weights");
  fs::create_directories(no_weights);
  fs::copy_file(good + "/adapter_config.json", no_weights + "/adapter_config.json");
  const std::string msg = error_message_of([&] { load_adapter(m, no_weights); });
  EXPECT_TRUE(contains(msg, "load_adapter: " + no_weights + "/adapter_model.safetensors: cannot open")) << msg;
  EXPECT_TRUE(snapshot(m) == before);
}

TEST(LoraAdapter, LoadChecksAModelThatAlreadyHasLora) {
  const std::string dir = fresh_dir("mismatch");
  saved_adapter(dir);  // r = 4, alpha = 8, targets [c_attn, c_fc, c_proj]
  const std::string config = dir + "/adapter_config.json";
  auto expect_refused = [&](Tiny& m, const std::string& part) {
    const Snapshot before = snapshot(m);
    const std::string msg = error_message_of([&] { load_adapter(m, dir); });
    EXPECT_TRUE(contains(msg, "load_adapter: " + config + ": ")) << msg;
    EXPECT_TRUE(contains(msg, part)) << msg;
    EXPECT_TRUE(snapshot(m) == before) << part;
  };
  Tiny r2(11);
  apply_lora(r2, lora_options(2, 8, kAllLinears));
  expect_refused(r2,
                 "the adapter has r = 4, alpha = 8, use_rslora = false, targets [c_attn, c_fc, c_proj] but the "
                 "model's LoRA layer 'attn.c_attn' has r = 2");
  Tiny other_targets(11);
  apply_lora(other_targets, lora_options(4, 8, {"c_attn"}));
  expect_refused(other_targets,
                 "but the model's LoRA layer 'attn.c_attn' has r = 4, alpha = 8, use_rslora = false, "
                 "targets [c_attn]");
  Tiny rslora(11);
  LoRAOptions o = lora_options(4, 8, kAllLinears);
  o.use_rslora = true;
  apply_lora(rslora, o);
  expect_refused(rslora, "has r = 4, alpha = 8, use_rslora = true");
  Tiny merged(11);
  apply_lora(merged, lora_options(4, 8, kAllLinears));
  merge_lora(merged);
  expect_refused(merged, "the model's LoRA layer 'attn.c_attn' is merged; unmerge_lora first");

  HalfSlotted slotless;  // the file fits, but "fc" cannot be replaced
  const std::string half = fresh_dir("half");
  // Written by hand: apply_lora itself cannot put LoRA on "fc".
  fs::create_directories(half);
  save_safetensors(half + "/adapter_model.safetensors", {{"base_model.model.head.lora_A.weight", zeros({2, 4})},
                                                         {"base_model.model.head.lora_B.weight", zeros({4, 2})},
                                                         {"base_model.model.fc.lora_A.weight", zeros({2, 4})},
                                                         {"base_model.model.fc.lora_B.weight", zeros({4, 2})}});
  write_text(half + "/adapter_config.json",
             R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["head", "fc"]})");
  const Snapshot before = snapshot(slotless);
  const std::string msg = error_message_of([&] { load_adapter(slotless, half); });
  EXPECT_TRUE(
      contains(msg, "load_adapter: " + half + "/adapter_config.json: apply_lora: cannot put a LoRALinear at 'fc'"))
      << msg;
  EXPECT_TRUE(snapshot(slotless) == before);
}

// ---------------------------------------------------------------------------
// The config reader on its own (ops/nn/adapter_config.h)

TEST(LoraAdapterConfig, ParsesWhatReadAdapterConfigReads) {
  const std::string text =
      R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8.5, "lora_dropout": 0.1, "use_rslora": true,
          "target_modules": ["c_attn", "c_fc"], "bias": "none", "use_dora": false, "rank_pattern": {}})";
  const LoRAOptions o = parse_adapter_config(text, "a/adapter_config.json");
  EXPECT_EQ(o.r, 4);
  EXPECT_EQ(o.alpha, 8.5);
  EXPECT_EQ(o.dropout, 0.1);
  EXPECT_TRUE(o.use_rslora);
  EXPECT_EQ(o.target_modules, (std::vector<std::string>{"c_attn", "c_fc"}));
  const std::string dir = fresh_dir("config_only");
  fs::create_directories(dir);
  write_text(dir + "/adapter_config.json", text);
  const LoRAOptions read = read_adapter_config(dir + "/adapter_config.json");
  EXPECT_EQ(std::tie(read.r, read.alpha, read.dropout, read.use_rslora, read.target_modules, read.target_regex),
            std::tie(o.r, o.alpha, o.dropout, o.use_rslora, o.target_modules, o.target_regex));
}

// nlohmann/json reports a number beyond a double as out_of_range, not parse_error; the
// reader must still answer with a FileError.
TEST(LoraAdapterConfig, NumberBeyondADoubleIsAFileError) {
  const std::string msg = error_message_of([] {
    parse_adapter_config(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 1e999, "target_modules": ["fc"]})",
                         "a/adapter_config.json");
  });
  EXPECT_TRUE(contains(msg, "load_adapter: a/adapter_config.json: malformed JSON: ")) << msg;
  EXPECT_TRUE(contains(msg, "number overflow")) << msg;
}

// Error messages print the offending value, and printing recurses once per level: a value
// nested 100,000 deep must be refused before anything prints it.
TEST(LoraAdapterConfig, DeepNestingIsRefusedBeforeItCanOverflowTheStack) {
  const int depth = 100000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  const std::string msg = error_message_of(
      [&] { parse_adapter_config(R"({"peft_type": "LORA", "r": )" + deep + "}", "a/adapter_config.json"); });
  EXPECT_TRUE(contains(msg, "load_adapter: a/adapter_config.json: JSON nests deeper than 64 levels")) << msg;
  // 64 levels are still read (and refused for what they hold, not for their depth).
  const std::string ok = std::string(63, '[') + std::string(63, ']');
  const std::string shallow = error_message_of(
      [&] { parse_adapter_config(R"({"peft_type": "LORA", "r": )" + ok + "}", "a/adapter_config.json"); });
  EXPECT_TRUE(contains(shallow, "r must be a positive integer, got [[[")) << shallow;
}

}  // namespace
}  // namespace mt::nn
