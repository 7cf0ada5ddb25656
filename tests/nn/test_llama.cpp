// The Llama-family model: config.json reading and its errors, parameter paths, causality, the
// loss's ignored targets, and Hugging Face directories whole and sharded (dtype kept, bad
// indexes and shards named). Logits against transformers: tools/parity/llama_parity.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "autograd/anomaly.h"
#include "autograd/autocast.h"
#include "core/safetensors.h"
#include "ops/nn/fp8_base.h"
#include "ops/nn/hf_checkpoint.h"
#include "ops/nn/llama.h"
#include "ops/nn/lora.h"
#include "ops/nn/parameter_init.h"
#include "ops/ops.h"
#include "tests/nn/lora_test_util.h"
#include "tests/nn/tiny_llama.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

namespace fs = std::filesystem;

class LlamaFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_llama_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string config_file(const std::string& json) {
    const std::string path = (dir_ / "config.json").string();
    write_bytes(path, json);
    return path;
  }
  fs::path dir_;
};

Tensor ids_of(const std::vector<double>& values, int64_t b, int64_t t) {
  return from_vector(values, {b, t}, TensorOptions().dtype(DType::i64));
}

TEST(Llama, ParameterPathsAreTransformersAndGqaShapesFollowTheConfig) {
  Generator g(1);
  Llama model(tiny_llama_config(), &g);
  const auto state = model.state_dict();
  EXPECT_EQ(state.at("model.layers.1.self_attn.q_proj.weight").shape(), (Shape{24, 24}));
  EXPECT_EQ(state.at("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{8, 24}));  // 2 kv heads of 4
  EXPECT_EQ(state.at("model.layers.0.mlp.gate_proj.weight").shape(), (Shape{40, 24}));
  EXPECT_EQ(state.at("lm_head.weight").shape(), (Shape{37, 24}));
  EXPECT_TRUE(state.count("model.norm.weight") && state.count("model.layers.0.post_attention_layernorm.weight"));
  EXPECT_FALSE(state.count("model.layers.0.self_attn.q_proj.bias"));
  LlamaConfig tied = tiny_llama_config();
  tied.tie_word_embeddings = true;
  EXPECT_FALSE(Llama(tied, &g).state_dict().count("lm_head.weight"));
}

TEST(Llama, EarlierLogitsDoNotDependOnLaterTokensAndIgnoredTargetsDoNotCount) {
  Generator g(2);
  Llama model(tiny_llama_config(), &g);
  NoGradGuard no_grad;
  const auto a = model.forward(ids_of({1, 2, 3, 4, 5}, 1, 5)).to_vector<double>();
  const auto b = model.forward(ids_of({1, 2, 3, 9, 9}, 1, 5)).to_vector<double>();
  for (size_t i = 0; i < 3 * 37; ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
  EXPECT_GT(std::abs(a[4 * 37] - b[4 * 37]), 1e-6);
  // Targets of -100 drop out of the mean: the loss over [t0, -100] is the loss of t0 alone.
  const Tensor ids = ids_of({1, 2}, 1, 2);
  const double both = model.loss(ids, ids_of({7, -100}, 1, 2)).item();
  const double first = model.loss(ids_of({1}, 1, 1), ids_of({7}, 1, 1)).item();
  EXPECT_NEAR(both, first, 1e-6);
}

TEST(Llama, KvCacheStepsGiveTheLogitsOfTheWholeSequenceAndTheSameGreedyTokens) {
  Generator g(6);
  LlamaConfig c = tiny_llama_config();
  c.rope_theta = 500000.0;
  Llama model(c, &g);
  model.eval();
  NoGradGuard no_grad;
  const std::vector<double> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  KVCache cache;
  model.forward_cached(ids_of({3, 1, 4, 1, 5}, 1, 5), cache);  // a prompt, then one token a step
  for (size_t n = 6; n <= tokens.size(); ++n) {
    const auto step = model.forward_cached(ids_of({tokens[n - 1]}, 1, 1), cache).to_vector<double>();
    const auto whole = model.forward(ids_of(std::vector<double>(tokens.begin(), tokens.begin() + n), 1, n));
    const auto last = whole.slice(1, n - 1, n).to_vector<double>();
    for (size_t v = 0; v < last.size(); ++v) EXPECT_NEAR(step[v], last[v], 1e-5) << "length " << n << ", id " << v;
  }
  EXPECT_EQ(cache.length, 8);
  GenerateOptions greedy;
  greedy.max_new_tokens = 20;  // past max_position_embeddings 32 with the prompt: the window takes over
  greedy.temperature = 0;
  GenerateOptions uncached = greedy;
  uncached.use_cache = false;
  const std::vector<int64_t> prompt(15, 2);
  EXPECT_EQ(generate(model, prompt, greedy), generate(model, prompt, uncached));
  // top_p that keeps only the most likely token samples greedily; a stop token ends the sequence.
  GenerateOptions nucleus = greedy;
  nucleus.temperature = 1.0;
  nucleus.top_p = 1e-9;
  Generator s(1);
  EXPECT_EQ(generate(model, prompt, nucleus, &s), generate(model, prompt, greedy));
  GenerateOptions stopping = greedy;
  const auto expected = generate(model, prompt, greedy);
  stopping.stop_token = expected[16];
  std::vector<int64_t> streamed;
  stopping.on_token = [&](int64_t t) { streamed.push_back(t); };
  const auto stopped = generate(model, prompt, stopping);
  EXPECT_EQ(stopped.back(), expected[16]);
  EXPECT_LE(stopped.size(), 17u);
  EXPECT_EQ(streamed, std::vector<int64_t>(stopped.begin() + 15, stopped.end()));
}

// Layers recomputed in backward (blocks, blocks:2) give the loss and every gradient of the plain
// run, bit for bit on the CPU and within bf16 autocast's rounding on CUDA (the recomputation's
// GEMMs may take other cuBLASLt algorithms); 'selective' is refused naming the model type.
// With LoRA on all seven projections over a frozen base, the recomputation leaves each MLP's
// output unwritten (OutputValues::unread) and every SwiGLU output is rebuilt in backward: the
// adapters' gradients are still those of the plain run.
enum class Base { full, lora, lora_fp8 };  // trained whole; LoRA over a frozen bf16/f32 or FP8 base

void expect_checkpointing_changes_nothing(Device device, bool autocast, double tol, Base base = Base::full) {
  LlamaConfig c = tiny_llama_config();
  c.hidden_size = 64;
  c.num_attention_heads = 4;  // head_dim 16: cuDNN's fused attention on CUDA
  c.num_key_value_heads = 2;
  c.num_hidden_layers = 4;
  c.intermediate_size = 48;  // FP8 GEMMs take sides that are multiples of 16
  Generator init(3);
  Llama model(c, &init);
  if (base != Base::full) {
    apply_lora(model, lora_test::lora_options(
                          4, 8, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
    lora_test::randomize_b(model);  // else every dA is zero
    if (base == Base::lora_fp8) EXPECT_EQ(quantize_linears_fp8(model).size(), 28u);
  }
  model.to(device);
  Generator data(4);
  const Tensor ids = uniform({2, 12}, 0, 37, {}, &data).to(DType::i64).to(device);
  std::vector<std::vector<double>> runs;
  std::vector<double> losses;
  for (const std::string mode : {"off", "blocks", "blocks:2", "layers:2"}) {
    model.set_checkpointing(mode);
    EXPECT_EQ(model.checkpointing(), mode);
    for (Tensor p : model.parameters()) p.set_grad(Tensor());
    Tensor loss;
    {
      AutocastGuard guard(device.type, DType::bf16, autocast);
      loss = model.loss(ids.slice(1, 0, 11), ids.slice(1, 1, 12));
    }
    loss.backward();
    losses.push_back(loss.item());
    std::vector<double> grads;
    for (const Tensor& p : model.trainable_parameters()) {
      for (const double v : p.grad().to_vector<double>()) grads.push_back(v);
    }
    runs.push_back(grads);
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    EXPECT_NEAR(losses[r], losses[0], tol * std::abs(losses[0])) << "run " << r;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < runs[0].size(); ++i) {
      diff += (runs[r][i] - runs[0][i]) * (runs[r][i] - runs[0][i]);
      norm += runs[0][i] * runs[0][i];
    }
    EXPECT_LE(std::sqrt(diff / norm), tol) << "run " << r;
  }
  const std::string msg = [&] {
    try {
      model.set_checkpointing("selective");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(msg.find("selective"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
}

// A model drawn under a ParameterInitGuard in bf16 (on `device`) holds the default f32 CPU model's
// values rounded once to bf16; normal draws on CUDA may differ from the CPU's in their last f32 bits
// (core/random.h), which can move a bf16 rounding by one ulp (2^-8 relative).
void expect_drawn_in_place_like_the_default(const Device& device, double rel_tol) {
  Generator g1(5), g2(5);
  const Llama reference(tiny_llama_config(), &g1);
  std::shared_ptr<Llama> drawn;
  {
    ParameterInitGuard guard(ParameterInit{TensorOptions(DType::bf16).device(device)});
    drawn = std::make_shared<Llama>(tiny_llama_config(), &g2);
  }
  EXPECT_EQ(parameter_init().options.dtype(), DType::f32) << "the guard restores the default";
  const auto want = reference.named_parameters();
  const auto got = drawn->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(got[i].first);
    EXPECT_EQ(got[i].second.dtype(), DType::bf16);
    EXPECT_EQ(got[i].second.device(), device);
    const std::vector<double> a = got[i].second.to(kCPU).to(DType::f64).to_vector<double>();
    const std::vector<double> b = want[i].second.to(DType::bf16).to(DType::f64).to_vector<double>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) EXPECT_LE(std::abs(a[j] - b[j]), rel_tol * std::abs(b[j])) << j;
  }
}

TEST(Llama, DrawnInBf16UnderAParameterInitGuardHoldsTheF32ModelsValuesRounded) {
  expect_drawn_in_place_like_the_default(kCPU, 0.0);
}
TEST(Llama, CudaDrawnOnTheGpuUnderAParameterInitGuardHoldsTheF32ModelsValuesRounded) {
  MT_SKIP_WITHOUT_CUDA();
  expect_drawn_in_place_like_the_default(Device("cuda"), 1.0 / 128);
}

TEST(Llama, CheckpointedLayersGiveTheSameLossAndGradients) {
  expect_checkpointing_changes_nothing(kCPU, /*autocast=*/false, 0.0);
}
TEST(Llama, CudaCheckpointedLayersGiveTheSameLossAndGradientsUnderAutocast) {
  MT_SKIP_WITHOUT_CUDA();
  expect_checkpointing_changes_nothing(Device("cuda"), /*autocast=*/true, 1e-2);
}
// Anomaly detection through a whole causal model on the CPU, whose attention masks with -inf, and
// through its checkpointed LoRA layers, whose recomputation then computes every output.
TEST(Llama, AnomalyDetectionPassesAFiniteTrainingStep) {
  Generator init(3);
  Llama model(tiny_llama_config(), &init);
  apply_lora(model, lora_test::lora_options(4, 8, {"q_proj", "v_proj", "down_proj"}));
  lora_test::randomize_b(model);
  model.set_checkpointing("blocks");
  Generator data(4);
  const Tensor ids = uniform({2, 12}, 0, 37, {}, &data).to(DType::i64);
  AnomalyGuard anomaly;
  Tensor loss = model.loss(ids.slice(1, 0, 11), ids.slice(1, 1, 12));
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item()));
  for (const Tensor& p : model.trainable_parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(Llama, CheckpointedLoraLayersGiveTheSameLossAndAdapterGradients) {
  expect_checkpointing_changes_nothing(kCPU, /*autocast=*/false, 0.0, Base::lora);
  expect_checkpointing_changes_nothing(kCPU, /*autocast=*/false, 0.0, Base::lora_fp8);
}
TEST(Llama, CudaCheckpointedLoraLayersGiveTheSameLossAndAdapterGradientsUnderAutocast) {
  MT_SKIP_WITHOUT_CUDA();
  expect_checkpointing_changes_nothing(Device("cuda"), /*autocast=*/true, 1e-2, Base::lora);
  expect_checkpointing_changes_nothing(Device("cuda"), /*autocast=*/true, 1e-2, Base::lora_fp8);
}

// Packed rows: three examples (6, 5 and 4 tokens) packed into two rows of 10 positions, against the
// same examples one per row, padded. The mean loss over their real targets and every gradient are
// the same: each example's positions restart at 0 and its attention stays inside it. Bit for bit
// is not expected (other GEMM shapes sum in another order): within f32 rounding on the CPU, bf16
// autocast's on CUDA; with every layer recomputed, so the checkpointed path carries the layout too.
void expect_packed_rows_equal_padded_rows(Device device, bool autocast, double tol) {
  LlamaConfig c = tiny_llama_config();
  c.hidden_size = 64;
  c.num_attention_heads = 4;  // head_dim 16: cuDNN's fused attention, with the mask as a bias, on CUDA
  c.num_key_value_heads = 2;
  Generator init(3);
  Llama model(c, &init);
  model.to(device);
  const std::vector<std::vector<double>> examples = {{1, 5, 9, 2, 30, 7}, {3, 3, 8, 21, 4}, {11, 6, 19, 36}};
  const int64_t T = 10;
  // Packed: row 0 holds examples 0 and 1 (5 + 4 positions, one padding), row 1 example 2 (3, seven padding).
  std::vector<double> ids(2 * T, 0), targets(2 * T, -100), positions(2 * T, 0), segments(2 * T, 0);
  const std::vector<std::pair<int64_t, int64_t>> where = {{0, 0}, {0, 5}, {1, 0}};  // (row, first position)
  for (size_t e = 0; e < examples.size(); ++e) {
    const auto [row, first] = where[e];
    for (size_t i = 0; i + 1 < examples[e].size(); ++i) {
      const size_t at = static_cast<size_t>(row * T + first) + i;
      ids[at] = examples[e][i];
      targets[at] = examples[e][i + 1];
      positions[at] = static_cast<double>(i);
      segments[at] = static_cast<double>(e);
    }
  }
  for (size_t at : {size_t{9}}) segments[at] = 9, positions[at] = 0;  // row 0's padding: a segment of its own
  for (size_t at = 13; at < 20; ++at) segments[at] = 9, positions[at] = static_cast<double>(at - 13);
  // Padded: one example per row.
  std::vector<double> ids_p(3 * T, 0), targets_p(3 * T, -100);
  for (size_t e = 0; e < examples.size(); ++e) {
    for (size_t i = 0; i + 1 < examples[e].size(); ++i) {
      ids_p[e * T + i] = examples[e][i];
      targets_p[e * T + i] = examples[e][i + 1];
    }
  }
  const auto i64 = [&](const std::vector<double>& v, int64_t rows) {
    return from_vector(v, {rows, T}, TensorOptions().dtype(DType::i64).device(device));
  };
  const auto run = [&](const std::function<Tensor()>& loss_fn) {
    for (Tensor p : model.parameters()) p.set_grad(Tensor());
    AutocastGuard guard(device.type, DType::bf16, autocast);
    Tensor loss = loss_fn();
    loss.backward();
    std::vector<double> values = {loss.item()};
    for (const Tensor& p : model.parameters()) {
      const std::vector<double> g = p.grad().to(kCPU).to(DType::f64).to_vector<double>();
      values.insert(values.end(), g.begin(), g.end());
    }
    return values;
  };
  model.set_checkpointing("blocks");
  const PackedSequences packed{i64(positions, 2), i64(segments, 2)};
  const std::vector<double> a = run([&] { return model.packed_loss(i64(ids, 2), i64(targets, 2), packed); });
  model.set_checkpointing("off");
  const std::vector<double> b = run([&] { return model.loss(i64(ids_p, 3), i64(targets_p, 3)); });
  EXPECT_NEAR(a[0], b[0], tol * std::abs(b[0])) << "the loss";
  EXPECT_LE(relative_l2(a, b), tol) << "the gradients";
  // One segment id for the whole row lets the examples attend to each other: the loss changes. (In
  // f32, where packed and padded agree to rounding; in this small random model the change is below
  // bf16 autocast's tolerance.)
  if (autocast) return;
  const PackedSequences joined{i64(positions, 2), i64(std::vector<double>(2 * T, 0), 2)};
  const std::vector<double> wrong = run([&] { return model.packed_loss(i64(ids, 2), i64(targets, 2), joined); });
  EXPECT_GT(std::abs(wrong[0] - b[0]), 1e-3 * std::abs(b[0])) << "attention across examples must change the loss";
}

TEST(Llama, PackedRowsGiveTheLossAndGradientsOfOneExamplePerRow) {
  expect_packed_rows_equal_padded_rows(kCPU, /*autocast=*/false, 2e-5);
}
TEST(Llama, CudaPackedRowsGiveTheLossAndGradientsOfOneExamplePerRowUnderAutocast) {
  MT_SKIP_WITHOUT_CUDA();
  expect_packed_rows_equal_padded_rows(Device("cuda"), /*autocast=*/true, 2e-2);
}

TEST(Llama, PackedLayoutErrorsNameTheTensor) {
  Generator init(3);
  const Llama model(tiny_llama_config(), &init);
  const Tensor ids = ids_of({1, 2, 3, 4}, 1, 4);
  const std::string msg = error_message_of([&] {
    model.packed_loss(ids, ids, PackedSequences{ids_of({0, 1, 2}, 1, 3), ids});
  });
  EXPECT_NE(msg.find("positions"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1, 4]"), std::string::npos) << msg;
}

TEST_F(LlamaFiles, ConfigErrorsNameTheFileAndTheField) {
  const auto message = [&](const std::string& json) {
    return error_message_of([&] { LlamaConfig::from_json_file(config_file(json)); });
  };
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 16)";
  EXPECT_NO_THROW(LlamaConfig::from_json_file(config_file("{\"model_type\": \"llama\", " + base + "}")));
  EXPECT_NE(
      message(R"({"model_type": "llama", "vocab_size": 10})").find("config.json: the config has no \"hidden_size\""),
      std::string::npos);
  EXPECT_NE(message("{\"model_type\": \"gpt2\", " + base + "}").find("model_type \"gpt2\" is not a Llama-family model"),
            std::string::npos);
  EXPECT_NE(
      message("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}, " + base + "}")
          .find("rope_scaling of type \"yarn\" is not supported"),
      std::string::npos);
  EXPECT_NE(message("{\"model_type\": \"llama\", \"hidden_act\": \"gelu\", " + base + "}").find("hidden_act \"gelu\""),
            std::string::npos);
  EXPECT_NE(message("{\"model_type\": \"llama\", \"num_key_value_heads\": 3, " + base + "}")
                .find("num_attention_heads 2 is not a multiple of num_key_value_heads 3"),
            std::string::npos);
}

TEST_F(LlamaFiles, SlidingWindowShorterThanTheSequenceIsRefused) {
  LlamaConfig c = tiny_llama_config();
  c.model_type = "mistral";
  c.sliding_window = 4;
  Generator g(3);
  Llama model(c, &g);
  NoGradGuard no_grad;
  EXPECT_NO_THROW(model.forward(ids_of({1, 2, 3, 4}, 1, 4)));
  EXPECT_NE(error_message_of([&] {
              model.forward(ids_of({1, 2, 3, 4, 5}, 1, 5));
            }).find("sliding_window 4"),
            std::string::npos);
}

TEST_F(LlamaFiles, SavePretrainedShardedLoadsBackBitExactInItsDtype) {
  Generator g(4);
  LlamaConfig c = tiny_llama_config();
  c.tie_word_embeddings = true;
  c.attention_bias = c.o_proj_bias = true;  // Llama's attention_bias: q, k, v and o
  Llama model(c, &g);
  model.to(DType::bf16);
  const std::string dir = (dir_ / "model").string();
  model.save_pretrained(dir, /*max_shard_bytes=*/4000);
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(dir + "/model-00002-of-" + [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".safetensors";
    char s[8];
    std::snprintf(s, sizeof s, "%05d", n);
    return std::string(s);
  }() + ".safetensors"));
  const auto loaded = Llama::from_pretrained(dir);
  EXPECT_EQ(loaded->model->embed_tokens->weight.dtype(), DType::bf16);  // no f32 copy of a bf16 checkpoint
  for (const auto& [name, t] : model.state_dict()) {
    const Tensor other = loaded->state_dict().at(name);
    EXPECT_EQ(t.to(DType::f64).to_vector<double>(), other.to(DType::f64).to_vector<double>()) << name;
  }
}

TEST_F(LlamaFiles, BadIndexesAndShardsNameTheFile) {
  Generator g(5);
  Llama model(tiny_llama_config(), &g);
  const std::string dir = (dir_ / "model").string();
  model.save_pretrained(dir, 4000);
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string text = read_bytes(index);
  // A shard the index names is missing.
  write_bytes(index, std::string(text).replace(text.find("model-00001-of-"), 15, "model-99999-of-"));
  const std::string missing = error_message_of([&] { Llama::from_pretrained(dir); });
  EXPECT_NE(missing.find("names the shard 'model-99999-of-"), std::string::npos) << missing;
  // A tensor the index maps to a shard is not in it.
  const std::string moved = "\"lm_head.weight\": \"";
  size_t at = text.find(moved) + moved.size();
  std::string wrong = text;
  wrong.replace(at, 15, text.substr(at, 15) == "model-00001-of-" ? "model-00002-of-" : "model-00001-of-");
  write_bytes(index, wrong);
  EXPECT_NE(error_message_of([&] { Llama::from_pretrained(dir); }).find("has no tensor 'lm_head.weight'"),
            std::string::npos);
  write_bytes(index, text);
  // A tensor of the wrong shape: the config says another width.
  LlamaConfig other = tiny_llama_config();
  other.intermediate_size = 44;
  write_bytes(dir + "/config.json", other.to_json());
  const std::string message = error_message_of([&] { Llama::from_pretrained(dir); });
  EXPECT_NE(message.find("model.safetensors.index.json: not a checkpoint of this llama config"), std::string::npos)
      << message;
  EXPECT_NE(message.find("down_proj.weight' has shape [24, 40] in the state but [24, 44]"), std::string::npos)
      << message;
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_bytes(dir + "/config.json", other.to_json());
  EXPECT_NE(error_message_of([&] { Llama::from_pretrained(dir); }).find("holds neither model.safetensors nor"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::nn
