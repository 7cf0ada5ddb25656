// GPT: Hugging Face names and layout, save/load round trips, causality, training, sampling.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "autograd/node.h"
#include "core/safetensors.h"
#include "core/view.h"
#include "ops/backends.h"
#include "ops/nn/gpt.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/graph_step.h"
#include "tests/nn/tiny_gpt.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

std::string scratch_dir(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("mt_gpt_" + name)).string();
  std::filesystem::remove_all(dir);
  return dir;
}

Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  std::vector<double> ids(static_cast<size_t>(B * T));
  const std::vector<double> u = rand({B * T}, {}, &g).to_vector<double>();
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = std::floor(u[i] * static_cast<double>(vocab));
  return from_vector(ids, {B, T}, DType::i64);
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

TEST(GPT, ParameterPathsAreHuggingFacesAndTheCountMatchesTheFormula) {
  const GPTConfig c = tiny_config();
  GPT model(c);
  std::vector<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  const std::vector<std::string> first_block = {
      "transformer.h.0.ln_1.weight",      "transformer.h.0.ln_1.bias",          "transformer.h.0.attn.c_attn.weight",
      "transformer.h.0.attn.c_attn.bias", "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias",
      "transformer.h.0.ln_2.weight",      "transformer.h.0.ln_2.bias",          "transformer.h.0.mlp.c_fc.weight",
      "transformer.h.0.mlp.c_fc.bias",    "transformer.h.0.mlp.c_proj.weight",  "transformer.h.0.mlp.c_proj.bias"};
  ASSERT_EQ(names.size(), 2 + 12 * 2 + 2u);
  EXPECT_EQ(names[0], "transformer.wte.weight");
  EXPECT_EQ(names[1], "transformer.wpe.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 2, names.begin() + 14), first_block);
  EXPECT_EQ(names.back(), "transformer.ln_f.bias");
  // Per block: 2 layer norms, qkv, attention out, MLP in and out (the LM head is the tied wte).
  const int64_t C = c.n_embd, F = 4 * C;
  const int64_t block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * F + F) + (F * C + C);
  EXPECT_EQ(model.num_parameters(), c.vocab_size * C + c.n_positions * C + c.n_layer * block + 2 * C);
}

TEST(GPT, InitialisationFollowsGpt2AndTheInitialLossIsNearLogV) {
  const GPTConfig c = tiny_config();
  Generator g(7);
  GPT model(c, &g);
  auto stddev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (double v : values(t)) s += v, s2 += v * v;
    const double n = static_cast<double>(t.numel());
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  EXPECT_NEAR(stddev(model.transformer->wte->weight), 0.02, 0.002);
  EXPECT_NEAR(stddev(model.transformer->blocks[0]->mlp->c_proj->weight), 0.02 / std::sqrt(4.0), 0.002);
  for (double v : values(model.transformer->blocks[1]->attn->c_attn->bias)) EXPECT_EQ(v, 0.0);
  const Tensor ids = random_ids(4, 16, c.vocab_size, 1);
  const double loss = model.loss(ids.slice(1, 0, 15), ids.slice(1, 1, 16)).item();
  EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab_size)), 0.05);  // logits ~ 0 at init
}

TEST(GPT, EarlierLogitsDoNotDependOnLaterTokens) {
  const GPTConfig c = tiny_config();
  GPT model(c);
  const Tensor ids = random_ids(1, 10, c.vocab_size, 2);
  std::vector<double> changed = values(ids);
  changed[7] = std::fmod(changed[7] + 1, static_cast<double>(c.vocab_size));
  const std::vector<double> a = values(model.forward(ids).slice(1, 0, 7));
  const std::vector<double> b = values(model.forward(from_vector(changed, {1, 10}, DType::i64)).slice(1, 0, 7));
  EXPECT_EQ(a, b);
  EXPECT_NE(values(model.forward(ids).slice(1, 7, 8)),
            values(model.forward(from_vector(changed, {1, 10}, DType::i64)).slice(1, 7, 8)));
}

TEST(GPT, PackedSequencesAreRefusedNamingTheModelType) {
  Generator gen(1);
  const GPT model(tiny_config(), &gen);
  EXPECT_FALSE(model.supports_packing());
  const Tensor ids = from_vector({1, 2, 3}, {1, 3}, TensorOptions().dtype(DType::i64));
  try {
    model.packed_loss(ids, ids, PackedSequences{ids, ids});
    FAIL() << "expected a NotImplementedError";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2"), std::string::npos) << e.what();
  }
}

TEST(GPT, SavePretrainedWritesHuggingFaceLayoutAndLoadsBackBitExact) {
  const GPTConfig c = tiny_config();
  Generator g(3);
  GPT model(c, &g);
  const std::string dir = scratch_dir("roundtrip");
  model.save_pretrained(dir);

  const SafetensorsFile file = load_safetensors(dir + "/model.safetensors");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.tensors.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{c.n_embd, 3 * c.n_embd}));
  EXPECT_EQ(values(file.tensors.at("transformer.h.1.mlp.c_fc.weight")),
            values(model.transformer->blocks[1]->mlp->c_fc->weight.transpose(0, 1)));
  EXPECT_EQ(file.tensors.count("lm_head.weight"), 0u);  // tied, as HF saves GPT-2

  const auto loaded = GPT::from_pretrained(dir);
  EXPECT_EQ(loaded->config().n_head, c.n_head);
  for (const auto& [name, t] : model.state_dict()) EXPECT_EQ(values(loaded->state_dict().at(name)), values(t)) << name;
  const Tensor ids = random_ids(2, 12, c.vocab_size, 4);
  EXPECT_EQ(values(loaded->forward(ids)), values(model.forward(ids)));
}

TEST(GPT, LoadsCheckpointsWithoutTheBodyPrefixAndIgnoresMaskBuffers) {
  const GPTConfig c = tiny_config();
  Generator g(5);
  GPT model(c, &g);
  const std::string dir = scratch_dir("gpt2model");
  model.save_pretrained(dir);
  // Rewrite as GPT2Model would save it: no "transformer." prefix, with the old mask buffers.
  std::map<std::string, Tensor> bare;
  for (const auto& [name, t] : load_safetensors(dir + "/model.safetensors").tensors) bare[name.substr(12)] = t;
  bare["h.0.attn.bias"] = ones({1, 1, 16, 16});
  bare["lm_head.weight"] = bare["wte.weight"];
  save_safetensors(dir + "/model.safetensors", bare);
  GPT other(c);
  other.load_hf_weights(dir + "/model.safetensors");
  const Tensor ids = random_ids(1, 8, c.vocab_size, 6);
  EXPECT_EQ(values(other.forward(ids)), values(model.forward(ids)));
}

TEST(GPT, BadCheckpointsAndConfigsNameTheFileAndTheProblem) {
  const GPTConfig c = tiny_config();
  GPT model(c);
  const std::string dir = scratch_dir("bad");
  model.save_pretrained(dir);
  const std::string weights = dir + "/model.safetensors";
  auto with = [&](const std::function<void(std::map<std::string, Tensor>&)>& edit) {
    auto state = load_safetensors(dir + "/model.safetensors").tensors;
    edit(state);
    save_safetensors(dir + "/edited.safetensors", state);
    GPT fresh(c);
    return error_message_of([&] { fresh.load_hf_weights(dir + "/edited.safetensors"); });
  };
  std::string msg = with([](auto& s) { s.erase("transformer.ln_f.bias"); });
  EXPECT_NE(msg.find("edited.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing keys: transformer.ln_f.bias"), std::string::npos) << msg;
  msg = with([](auto& s) { s["transformer.h.9.attn.c_attn.weight"] = zeros({1}); });
  EXPECT_NE(msg.find("unexpected keys: transformer.h.9.attn.c_attn.weight"), std::string::npos) << msg;
  msg = with([](auto& s) { s["lm_head.weight"] = zeros(s["transformer.wte.weight"].shape()); });
  EXPECT_NE(msg.find("lm_head.weight differs from wte.weight"), std::string::npos) << msg;
  msg = with([](auto& s) { s["transformer.h.0.mlp.c_fc.weight"] = zeros({24, 24}); });
  EXPECT_NE(msg.find("transformer.h.0.mlp.c_fc.weight' has shape"), std::string::npos) << msg;

  auto config_error = [&](const std::string& text) {
    std::ofstream(dir + "/config.json") << text;
    return error_message_of([&] { GPT::from_pretrained(dir); });
  };
  msg = config_error("{\"model_type\": \"llama\"}");
  EXPECT_NE(msg.find("config.json: model_type is \"llama\""), std::string::npos) << msg;
  msg = config_error("{\"model_type\": \"gpt2\", \"activation_function\": \"relu\"}");
  EXPECT_NE(msg.find("activation_function \"relu\" is not supported"), std::string::npos) << msg;
  msg = config_error("{\"n_embd\": 10, \"n_head\": 3}");
  EXPECT_NE(msg.find("n_embd 10 is not a multiple of n_head 3"), std::string::npos) << msg;
  msg = config_error("{\"n_embd\": \"wide\"}");
  EXPECT_NE(msg.find("wrong type"), std::string::npos) << msg;
  msg = config_error("{not json");
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  msg = error_message_of([&] { GPT::from_pretrained(dir + "/nowhere"); });
  EXPECT_NE(msg.find("nowhere/config.json: cannot open"), std::string::npos) << msg;
}

TEST(GPT, SequencesLongerThanThePositionTableAreRejected) {
  GPT model(tiny_config());
  const std::string msg = error_message_of([&] { model.forward(zeros({1, 17}, DType::i64)); });
  EXPECT_NE(msg.find("sequence length 17 is outside [1, n_positions = 16]"), std::string::npos) << msg;
}

TEST(GPT, LearnsARepeatingSequence) {
  GPTConfig c = tiny_config();
  Generator g(11);
  GPT model(c, &g);
  AdamW opt(model.parameters(), AdamWOptions(1e-2).weight_decay(0.0));
  std::vector<double> pattern;
  for (int i = 0; i < 17; ++i) pattern.push_back((i * 5) % 11);
  const Tensor seq = from_vector(pattern, {1, 17}, DType::i64);
  const Tensor x = seq.slice(1, 0, 16), y = seq.slice(1, 1, 17);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    const Tensor loss = model.loss(x, y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.05 * first) << "first " << first << " last " << last;
  model.eval();
  std::vector<int64_t> prompt = {0, 5, 10};
  const std::vector<int64_t> out = generate(model, prompt, GenerateOptions{8, /*temperature=*/0.0, 0});
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<int64_t>((i * 5) % 11)) << i;
}

TEST(GPT, SamplingIsSeededAndTopOneIsGreedy) {
  GPT model(tiny_config());
  model.eval();
  Generator a(1), b(1), c(2);
  const GenerateOptions sample{20, 1.0, 0};
  const auto first = generate(model, {1, 2}, sample, &a);
  EXPECT_EQ(first.size(), 22u);
  EXPECT_EQ(generate(model, {1, 2}, sample, &b), first);
  EXPECT_NE(generate(model, {1, 2}, sample, &c), first);
  EXPECT_EQ(generate(model, {1, 2}, GenerateOptions{5, 1.0, 1}), generate(model, {1, 2}, GenerateOptions{5, 0.0, 0}));
  // Longer than n_positions: the context is cropped, not rejected.
  EXPECT_EQ(generate(model, std::vector<int64_t>(16, 3), GenerateOptions{3, 0.0, 0}).size(), 19u);
  const std::string msg = error_message_of([&] { generate(model, {1, 99}, sample); });
  EXPECT_NE(msg.find("prompt token 99 at position 1 is outside the vocabulary [0, 37)"), std::string::npos) << msg;
}

// A KV cache: the prompt once, then one token a step, gives the logits of the whole sequence
// at each new position, and generate() with it draws the tokens it draws without it.
TEST(GPT, KvCacheStepsGiveTheLogitsOfTheWholeSequenceAndTheSameTokens) {
  Generator init(3);
  GPT model(tiny_config(), &init);
  model.eval();
  NoGradGuard no_grad;
  auto ids = [](std::vector<double> v) {
    const auto n = static_cast<int64_t>(v.size());
    return from_vector(v, {1, n}, TensorOptions().dtype(DType::i64));
  };
  const std::vector<double> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  KVCache cache;
  model.forward_cached(ids({3, 1, 4, 1}), cache);
  for (size_t n = 5; n <= tokens.size(); ++n) {
    const auto step = model.forward_cached(ids({tokens[n - 1]}), cache).to_vector<double>();
    const auto whole = model.forward(ids(std::vector<double>(tokens.begin(), tokens.begin() + n)));
    const auto last = whole.slice(1, n - 1, n).to_vector<double>();
    for (size_t v = 0; v < last.size(); ++v) EXPECT_NEAR(step[v], last[v], 1e-5) << "length " << n << ", id " << v;
  }
  EXPECT_EQ(cache.length, 10);
  EXPECT_NE(error_message_of([&] {
              model.forward_cached(ids({1, 2}), cache);
            }).find("one token at a time"),
            std::string::npos);
  GenerateOptions cached{10, /*temperature=*/0.0, 0}, uncached = cached;  // 14 tokens: within n_positions 16
  uncached.use_cache = false;
  EXPECT_EQ(generate(model, {2, 7, 1, 8}, cached), generate(model, {2, 7, 1, 8}, uncached));
  Generator a(5), b(5);
  GenerateOptions sampled{20, 1.0, 5}, sampled_uncached = sampled;  // past n_positions: the window takes over
  sampled_uncached.use_cache = false;
  EXPECT_EQ(generate(model, {2, 7}, sampled, &a), generate(model, {2, 7}, sampled_uncached, &b));
}

// LoRA on the GPT's projections, then PEFT's merge_and_unload: a plain GPT again, with the
// base parameter names, that saves and loads like any GPT and computes what the adapted one did.
TEST(GPT, LoraMergeAndUnloadGivesAPlainModelWithTheAdaptersEffect) {
  const GPTConfig c = tiny_config();
  Generator g(21);
  GPT model(c, &g);
  std::vector<std::string> base_names;
  for (const auto& [name, t] : model.named_parameters()) base_names.push_back(name);
  LoRAOptions options;
  options.r = 4;
  options.target_modules = {"c_attn", "c_proj", "c_fc"};
  EXPECT_EQ(apply_lora(model, options, &g).size(), 4u * c.n_layer);  // c_proj matches in attn and in mlp
  {
    NoGradGuard no_grad;
    for (const auto& [path, layer] : lora_layers(model))
      layer->lora_B->weight.copy_(randn(layer->lora_B->weight.shape(), {}, &g));
  }
  const Tensor ids = random_ids(2, 12, c.vocab_size, 22);
  const std::vector<double> adapted = values(model.forward(ids));
  EXPECT_NE(adapted, values(GPT(c, nullptr).forward(ids)));

  merge_and_unload(model);
  EXPECT_TRUE(lora_layers(model).empty());
  std::vector<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, base_names);
  const std::string dir = scratch_dir("merged");
  model.save_pretrained(dir);
  const std::vector<double> merged = values(GPT::from_pretrained(dir)->forward(ids));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    worst = std::max(worst, std::abs(merged[i] - adapted[i]));
    scale = std::max(scale, std::abs(adapted[i]));
  }
  EXPECT_LE(worst, 1e-5 * scale);  // f32: the merged weight is rounded once
}

// The next-token loss on ids [B, T] and, after its backward, every trainable parameter's gradient.
std::vector<std::vector<double>> loss_and_gradients(const GPT& model, const Tensor& ids) {
  const int64_t t = ids.size(1);
  const Tensor loss = model.loss(ids.slice(1, 0, t - 1), ids.slice(1, 1, t));
  loss.backward();
  std::vector<std::vector<double>> out = {{loss.item()}};
  for (const auto& [name, p] : model.named_parameters()) {
    if (p.requires_grad()) out.push_back(values(p.grad()));
  }
  return out;
}

// Loss and every parameter's gradient after one backward, in training mode with dropout.
// With lora_targets, LoRA adapters (r 2) on those modules and the base frozen.
std::vector<std::vector<double>> gradients_with(const GPTCheckpointing& checkpointing, Device device,
                                                const std::vector<std::string>& lora_targets = {}) {
  GPTConfig c = tiny_config();
  c.n_layer = 3;
  c.dropout = 0.2;
  Generator g(31);
  GPT model(c, &g);
  if (!lora_targets.empty()) {
    LoRAOptions lora;
    lora.r = 2;
    lora.target_modules = lora_targets;
    lora.dropout = 0.1;
    apply_lora(model, lora, &g);
    for (const auto& [name, p] : model.named_parameters()) {  // B = 0 at init would hide A's gradient path
      if (name.find("lora_B") != std::string::npos) {
        NoGradGuard no_grad;
        p.copy_(randn(p.shape(), DType::f32, &g) * 0.1);
      }
    }
  }
  model.to(device);
  model.set_checkpointing(checkpointing);
  manual_seed(77);  // the dropout masks
  return loss_and_gradients(model, random_ids(2, 16, c.vocab_size, 32).to(device));
}

TEST(GPT, CheckpointingGivesBitIdenticalGradientsWithDropout) {
  const auto plain = gradients_with(GPTCheckpointing{}, kCPU);
  for (const char* mode : {"blocks", "blocks:2", "selective"}) {
    EXPECT_EQ(gradients_with(GPTCheckpointing::parse(mode), kCPU), plain) << mode;
  }
}

// LoRA on c_attn only: the MLP's projection is frozen, so checkpointed blocks keep it
// (and the dropout after it) outside the recomputed segment; on c_proj too, it trains
// and whole blocks are recomputed. Both must still give the plain run's gradients bit for bit.
TEST(GPT, CheckpointingWithFrozenProjectionsGivesBitIdenticalLoraGradients) {
  for (const std::vector<std::string>& targets :
       {std::vector<std::string>{"c_attn"}, std::vector<std::string>{"c_attn", "c_proj"}}) {
    const auto plain = gradients_with(GPTCheckpointing{}, kCPU, targets);
    const size_t adapted_per_block = targets.size() == 1 ? 1 : 3;  // "c_proj" is attn's and the MLP's projection
    ASSERT_EQ(plain.size(), 1 + 2 * 3 * adapted_per_block) << "loss and two adapter matrices per adapted layer";
    for (const char* mode : {"blocks", "blocks:2", "selective"}) {
      EXPECT_EQ(gradients_with(GPTCheckpointing::parse(mode), kCPU, targets), plain)
          << mode << " with " << targets.size() << " target(s)";
    }
  }
}

// A Linear by another type: MLP::hidden runs its forward and then gelu (the unfused ops),
// as it does for a LoRALinear in c_fc's place.
class SubclassedLinear : public Linear {
 public:
  using Linear::Linear;
};

TEST(MLP, HiddenIsOneLinearGeluOnlyForAPlainLinearWithABias) {
  Generator g(50);
  MLP mlp(TransformerShape{8, 2, 32, 0.0, 1e-5}, &g);
  const Tensor x = randn({2, 3, 8}, {}, &g);
  const Tensor fused = mlp.hidden(x);
  EXPECT_EQ(fused.grad_fn()->name(), "LinearGeluBackward");
  const Tensor unfused = gelu(linear(x, mlp.c_fc->weight, mlp.c_fc->bias), GeluApproximation::tanh);
  EXPECT_EQ(values(fused), values(unfused));  // on the CPU, the same GEMM and loops

  mlp.replace_module("c_fc", std::make_shared<SubclassedLinear>(mlp.c_fc->weight, mlp.c_fc->bias));
  EXPECT_EQ(mlp.hidden(x).grad_fn()->name(), "geluBackward");
  EXPECT_EQ(values(mlp.hidden(x)), values(unfused));

  mlp.replace_module("c_fc", std::make_shared<Linear>(mlp.c_fc->weight, Tensor()));
  EXPECT_EQ(mlp.hidden(x).grad_fn()->name(), "geluBackward");

  // A LoRALinear in c_fc's place: its own forward (base and adapter), then gelu.
  MLP adapted(TransformerShape{8, 2, 32, 0.0, 1e-5}, &g);
  LoRAOptions lora;
  lora.r = 2;
  lora.target_modules = {"c_fc"};
  ASSERT_EQ(apply_lora(adapted, lora, &g).size(), 1u);
  EXPECT_EQ(adapted.hidden(x).grad_fn()->name(), "geluBackward");
  EXPECT_EQ(values(adapted.hidden(x)), values(gelu(adapted.c_fc->forward(x), GeluApproximation::tanh)));
}

// MLP::forward is one mlp_gelu when both layers are plain Linears with biases, and gives what
// c_proj's forward of hidden(x) gives: the same output and gradients (f64, on the CPU).
TEST(MLP, ForwardIsOneMlpGeluOnlyForPlainLinearsWithBiases) {
  Generator g(51);
  MLP mlp(TransformerShape{8, 2, 32, 0.0, 1e-5}, &g);
  mlp.to(DType::f64);
  {
    NoGradGuard no_grad;  // GPT-2 starts its biases at zero: make them count
    mlp.c_fc->bias.copy_(randn({32}, DType::f64, &g));
    mlp.c_proj->bias.copy_(randn({8}, DType::f64, &g));
  }
  const Tensor x0 = randn({2, 3, 8}, DType::f64, &g), dy = randn({2, 3, 8}, DType::f64, &g);
  // The output, then the gradients of x and of every parameter.
  const auto run = [&](bool fused, const std::string& node) {
    Tensor x = x0.clone().requires_grad_();
    for (Tensor p : mlp.parameters()) p.set_grad(Tensor());
    const Tensor y = fused ? mlp.forward(x) : mlp.c_proj->forward(mlp.hidden(x));
    EXPECT_EQ(y.grad_fn()->name(), node);
    y.backward(dy);
    std::vector<std::vector<double>> out = {values(y), values(x.grad())};
    for (const Tensor& p : mlp.parameters()) out.push_back(values(p.grad()));
    return out;
  };
  const auto want = run(false, "LinearBackward");
  const auto got = run(true, "MlpGeluBackward");
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    for (size_t j = 0; j < got[i].size(); ++j) EXPECT_NEAR(got[i][j], want[i][j], 1e-12) << i << ", " << j;
  }

  // Anything else in either place, or a layer without its bias: each layer's own forward.
  const Tensor x = x0.clone();
  const std::shared_ptr<Linear> fc = mlp.c_fc, proj = mlp.c_proj;
  mlp.replace_module("c_proj", std::make_shared<SubclassedLinear>(proj->weight, proj->bias));
  EXPECT_EQ(mlp.forward(x).grad_fn()->name(), "LinearBackward");
  mlp.replace_module("c_proj", std::make_shared<Linear>(proj->weight, Tensor()));
  EXPECT_EQ(mlp.forward(x).grad_fn()->name(), "LinearBackward");
  mlp.replace_module("c_proj", proj);
  mlp.replace_module("c_fc", std::make_shared<SubclassedLinear>(fc->weight, fc->bias));
  EXPECT_EQ(mlp.forward(x).grad_fn()->name(), "LinearBackward");
  mlp.replace_module("c_fc", fc);
  EXPECT_EQ(mlp.forward(x).grad_fn()->name(), "MlpGeluBackward");
}

// Loss and gradients of a training step (dropout on) with the MLPs' first layer a plain Linear
// (the whole MLP one mlp_gelu) or a SubclassedLinear (linear, gelu, then linear); with
// lora_targets, LoRA on them.
std::vector<std::vector<double>> mlp_step(bool fused, const GPTCheckpointing& checkpointing,
                                          const std::vector<std::string>& lora_targets = {}) {
  GPTConfig c = tiny_config();
  c.dropout = 0.1;
  Generator g(40);
  GPT model(c, &g);
  if (!fused) {
    for (const auto& block : model.transformer->blocks) {
      const std::shared_ptr<MLP> mlp = block->mlp;
      mlp->replace_module("c_fc", std::make_shared<SubclassedLinear>(mlp->c_fc->weight, mlp->c_fc->bias));
    }
  }
  if (!lora_targets.empty()) {
    LoRAOptions lora;
    lora.r = 2;
    lora.target_modules = lora_targets;
    apply_lora(model, lora, &g);
  }
  model.set_checkpointing(checkpointing);
  manual_seed(78);  // the dropout masks
  return loss_and_gradients(model, random_ids(2, 16, c.vocab_size, 42));
}

// On the CPU the fused MLP computes exactly what linear, gelu and linear did: the same loss and
// gradients bit for bit, without checkpointing, with whole blocks or the attention core
// recomputed, and with a frozen MLP (LoRA on c_attn only), whose checkpointed blocks
// recompute ln_1 .. the GELU and keep the MLP's projection outside the segment.
TEST(GPT, FusedMlpGivesTheUnfusedLossAndGradients) {
  for (const char* mode : {"off", "blocks", "selective"}) {
    const GPTCheckpointing checkpointing = GPTCheckpointing::parse(mode);
    const auto fused = mlp_step(/*fused=*/true, checkpointing);
    ASSERT_EQ(fused.size(), static_cast<size_t>(1 + tiny_config().n_layer * 12 + 4))
        << "the loss and every parameter's gradient";
    EXPECT_EQ(fused, mlp_step(/*fused=*/false, checkpointing)) << mode;
    EXPECT_EQ(mlp_step(true, checkpointing, {"c_attn"}), mlp_step(false, checkpointing, {"c_attn"})) << mode;
  }
}

// GPT::set_fused_ops(false) swaps add_layer_norm for add and layer_norm, and mlp_gelu for
// linear_gelu and linear: on the CPU the same loss and gradients bit for bit, fully trained
// and with LoRA on c_attn.
TEST(GPT, UnfusedOpsGiveTheFusedLossAndGradients) {
  for (const bool lora : {false, true}) {
    std::vector<std::vector<double>> results[2];
    for (const bool fused : {true, false}) {
      Generator g(44);
      GPT model(tiny_config(), &g);
      if (lora) {
        LoRAOptions options;
        options.r = 2;
        options.target_modules = {"c_attn"};
        apply_lora(model, options, &g);
      }
      model.set_fused_ops(fused);
      const Block& block = *model.transformer->blocks[0];
      const Tensor x = randn({2, 3, tiny_config().n_embd}, DType::f32, &g).requires_grad_();
      EXPECT_EQ(block.mlp->forward(x).grad_fn()->name(), fused ? "MlpGeluBackward" : "LinearBackward");
      EXPECT_EQ(block.ln_2->forward_add(x, x).normed.grad_fn()->name(),
                fused ? "AddLayerNormBackward" : "LayerNormBackward");
      results[fused] = loss_and_gradients(model, random_ids(2, 16, tiny_config().vocab_size, 45));
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    EXPECT_EQ(results[0], results[1]) << (lora ? "LoRA on c_attn" : "full training");
  }
}

TEST(GPT, CheckpointingModesParseAndBadOnesAreNamed) {
  EXPECT_EQ(GPTCheckpointing::parse("blocks:3").every, 3);
  EXPECT_EQ(GPTCheckpointing::parse("selective").str(), "selective");
  EXPECT_EQ(GPTCheckpointing::parse("off").mode, GPTCheckpointing::Mode::off);
  for (const char* bad : {"blocks:0", "blocks:x", "block", "all", "blocks:2x"}) {
    EXPECT_NE(error_message_of([&] { GPTCheckpointing::parse(bad); }).find(std::string("'") + bad + "' is not one of"),
              std::string::npos)
        << bad;
  }
}

TEST(GPT, CudaCheckpointingMatchesWithinF32Rounding) {
  MT_SKIP_WITHOUT_CUDA();
  const auto plain = gradients_with(GPTCheckpointing{}, Device("cuda"));
  for (const char* mode : {"blocks", "selective"}) {
    const auto ckpt = gradients_with(GPTCheckpointing::parse(mode), Device("cuda"));
    ASSERT_EQ(ckpt.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      double num = 0, den = 0;
      for (size_t j = 0; j < plain[i].size(); ++j) {
        num += (plain[i][j] - ckpt[i][j]) * (plain[i][j] - ckpt[i][j]);
        den += plain[i][j] * plain[i][j];
      }
      // Embedding's CUDA backward adds with atomics, in no fixed order: equal up to f32 rounding.
      EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 1e-6) << mode << " tensor " << i;
    }
  }
}

// A GPT step (positions, embeddings, attention, the fused head) replayed from a CUDA Graph
// gives the eager steps' losses and weights bit for bit; with graphed_copies the graphed
// model's AdamW writes the weights' bf16 copies (AdamWOptions::autocast_copies) and the
// captured step reads them, where the eager twin casts its weights.
void expect_graph_replays_give_the_eager_steps(bool graphed_copies) {
  // cuDNN's attention backward adds dQ with atomics unless asked not to.
  const backends::DeterministicGuard deterministic;
  const Device cuda("cuda");
  const GPTConfig c = tiny_config();
  struct Run {
    std::unique_ptr<GPT> model;
    std::unique_ptr<AdamW> opt;
    Tensor x, y, loss_out;
    void step() {
      opt->zero_grad(/*set_to_none=*/false);
      Tensor loss;
      {
        AutocastGuard amp(DeviceType::cuda, DType::bf16);
        loss = model->loss(x, y);
      }
      loss.backward();
      opt->step();
      loss_out.copy_(loss.reshape({1}));
    }
  };
  auto make = [&](bool copies) {
    Generator g(21);
    Run r{std::make_unique<GPT>(c, &g), nullptr, zeros({2, 15}, TensorOptions(DType::i64).device(cuda)),
          zeros({2, 15}, TensorOptions(DType::i64).device(cuda)), zeros({1}, TensorOptions().device(cuda))};
    r.model->to(cuda);
    AdamWOptions options(1e-2);
    if (copies) options.autocast_copies(DType::bf16);
    r.opt = std::make_unique<AdamW>(r.model->parameters(), options);
    return r;
  };
  Run eager = make(false), graphed = make(graphed_copies);
  CudaGraphStep step(cuda, [&] { graphed.step(); }, {graphed.opt.get()});
  for (int i = 0; i < 6; ++i) {
    const Tensor ids = random_ids(2, 16, c.vocab_size, 100 + static_cast<uint64_t>(i)).to(cuda);
    for (Run* r : {&eager, &graphed}) {
      r->x.copy_(ids.slice(1, 0, 15));
      r->y.copy_(ids.slice(1, 1, 16));
    }
    const uint64_t before = autocast::cast_count();
    eager.step();
    const uint64_t eager_casts = autocast::cast_count() - before;
    step.run();
    const uint64_t graphed_casts = autocast::cast_count() - before - eager_casts;
    if (i == 2) {  // the capture (after two eager warm-up steps): it reads AdamW's copies or casts as eager does
      if (graphed_copies) {
        EXPECT_LT(graphed_casts, eager_casts) << "the capture must take AdamW's copies of the weights";
      } else {
        EXPECT_EQ(graphed_casts, eager_casts);
      }
    }
    EXPECT_EQ(graphed.loss_out.item(), eager.loss_out.item()) << "step " << i;
  }
  EXPECT_TRUE(step.captured());
  const auto e = eager.model->named_parameters(), g = graphed.model->named_parameters();
  for (size_t i = 0; i < e.size(); ++i) EXPECT_EQ(values(g[i].second), values(e[i].second)) << e[i].first;
}

TEST(GPT, CudaGraphReplaysGiveTheEagerStepsBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  expect_graph_replays_give_the_eager_steps(/*graphed_copies=*/false);
}

TEST(GPT, CudaGraphReplaysReadingAdamWsCopiesGiveTheCastingStepsBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  expect_graph_replays_give_the_eager_steps(/*graphed_copies=*/true);
}

TEST(GPT, CudaMatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const GPTConfig c = tiny_config();
  Generator g(13);
  GPT cpu(c, &g);
  GPT gpu(c);
  gpu.load_state_dict(cpu.state_dict());
  gpu.to(Device("cuda"));
  const Tensor ids = random_ids(2, 16, c.vocab_size, 14);
  const Tensor loss_cpu = cpu.loss(ids.slice(1, 0, 15), ids.slice(1, 1, 16));
  const Tensor loss_gpu = gpu.loss(ids.slice(1, 0, 15).to(Device("cuda")), ids.slice(1, 1, 16).to(Device("cuda")));
  loss_cpu.backward();
  loss_gpu.backward();
  EXPECT_NEAR(loss_gpu.item(), loss_cpu.item(), 1e-5 * loss_cpu.item());
  const auto gp = gpu.named_parameters();
  const auto cp = cpu.named_parameters();
  for (size_t i = 0; i < cp.size(); ++i) {
    const std::vector<double> a = values(cp[i].second.grad()), b = values(gp[i].second.grad());
    double num = 0, den = 0;
    for (size_t j = 0; j < a.size(); ++j) num += (a[j] - b[j]) * (a[j] - b[j]), den += a[j] * a[j];
    EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 1e-4) << cp[i].first;  // relative L2, f32, TF32 off
  }
}

}  // namespace
}  // namespace mt::nn
