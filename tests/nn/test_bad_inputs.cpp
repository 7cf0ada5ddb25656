// Bad inputs from outside that need a model to show: Hugging Face GPT-2 directories whose
// config.json and weights disagree, an adapter trained on another base model, and training
// checkpoints without optimizer state, cut short, or with a damaged value. Each error must
// name the file and say what is wrong; the readers' other refusals are tested beside their
// contracts (test_gpt.cpp, test_lora.cpp, tests/optim/test_training_checkpoint.cpp).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "ops/nn/gpt.h"
#include "ops/nn/llama.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/training_checkpoint.h"
#include "tests/nn/tiny_gpt.h"
#include "tests/nn/tiny_llama.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "mt_bad_inputs_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A tiny GPT saved with save_pretrained, its config.json then edited.
std::string saved_gpt(const std::string& name, const std::function<void(Json&)>& edit_config = {}) {
  const std::string dir = fresh_dir(name);
  GPT(tiny_config()).save_pretrained(dir);
  if (edit_config) {
    Json config = Json::parse(read_bytes(dir + "/config.json"));
    edit_config(config);
    write_bytes(dir + "/config.json", config.dump(2));
  }
  return dir;
}

// ---------------------------------------------------------------- Hugging Face GPT-2 directories

TEST(BadInputs, GptDirectoryWithoutWeightsNamesTheMissingFile) {
  const std::string dir = saved_gpt("no_weights");
  fs::remove(dir + "/model.safetensors");
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + ": holds neither model.safetensors nor model.safetensors.index.json")) << msg;
}

TEST(BadInputs, GptConfigWithUntiedEmbeddingsIsRefused) {
  const std::string dir = saved_gpt("untied", [](Json& c) { c["tie_word_embeddings"] = false; });
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + "/config.json: unsupported GPT-2 option")) << msg;
  EXPECT_TRUE(contains(msg, "tie_word_embeddings true")) << msg;
}

TEST(BadInputs, GptConfigWithUnequalDropoutRatesIsRefused) {
  const std::string dir = saved_gpt("dropouts", [](Json& c) { c["attn_pdrop"] = 0.2; });
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + "/config.json: resid_pdrop 0, embd_pdrop 0 and attn_pdrop 0.2 differ")) << msg;
}

TEST(BadInputs, GptConfigWithANonPositiveSizeIsRefused) {
  const std::string dir = saved_gpt("zero_layers", [](Json& c) { c["n_layer"] = 0; });
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + "/config.json: GPTConfig: n_layer must be positive, got 0")) << msg;
}

TEST(BadInputs, GptConfigWithAnotherVocabSizeThanTheWeightsNamesTheTensorAndBothShapes) {
  const std::string dir = saved_gpt("vocab", [](Json& c) { c["vocab_size"] = 40; });
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + "/model.safetensors: not a GPT-2 checkpoint for this config")) << msg;
  EXPECT_TRUE(contains(msg, "'transformer.wte.weight' has shape [37, 24] in the state but [40, 24] in the module"))
      << msg;
}

// A config with far more layers than the weights misses hundreds of keys: the message lists
// the first few and counts the rest.
TEST(BadInputs, GptConfigWithMoreLayersThanTheWeightsListsTheFirstMissingKeys) {
  const std::string dir = saved_gpt("layers", [](Json& c) { c["n_layer"] = 40; });
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + "/model.safetensors: not a GPT-2 checkpoint for this config")) << msg;
  EXPECT_TRUE(contains(msg, "missing keys: transformer.h.10.attn.c_attn.bias")) << msg;
  EXPECT_TRUE(contains(msg, " ... (448 more)")) << msg;  // 38 layers of 12 tensors, 8 named
  EXPECT_LT(msg.size(), 800u) << msg;
}

// 2^56 rows of 16 floats are 4 EiB: no allocator gives that, whatever the overcommit policy.
TEST(BadInputs, GptConfigTooLargeForMemoryNamesTheConfigAndTheSizes) {
  const std::string dir = saved_gpt("huge", [](Json& c) {
    c["vocab_size"] = int64_t{1} << 56;
    c["n_embd"] = 16;
    c["n_head"] = 2;
  });
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + "/config.json: the model it describes (vocab_size 72057594037927936")) << msg;
  EXPECT_TRUE(contains(msg, "does not fit in memory: out of host memory")) << msg;
}

TEST(BadInputs, GptWeightStoredAsIntegersNamesTheFileTheTensorAndBothDtypes) {
  const std::string dir = saved_gpt("integer_bias");
  SafetensorsFile file = load_safetensors(dir + "/model.safetensors");
  Tensor& bias = file.tensors.at("transformer.h.0.attn.c_attn.bias");
  bias = zeros(bias.shape(), TensorOptions().dtype(DType::i32));
  save_safetensors(dir + "/model.safetensors", file.tensors, file.metadata);
  const std::string msg = error_message_of([&] { GPT::from_pretrained(dir); });
  EXPECT_TRUE(contains(msg, dir + "/model.safetensors: ")) << msg;
  EXPECT_TRUE(contains(msg, "'transformer.h.0.attn.c_attn.bias' is stored as i32 but is f32 here")) << msg;
}

TEST(BadInputs, ModuleLoadOfAnIntegerTensorIntoAFloatingOneIsRefusedAndKeepsTheModule) {
  const std::string path = fresh_dir("integer_module") + "/linear.safetensors";
  Linear layer(LinearOptions(2, 3));
  const std::vector<double> before = layer.bias.to_vector<double>();
  save_safetensors(path,
                   {{"weight", layer.weight.detach()}, {"bias", full({3}, 7.0, TensorOptions().dtype(DType::i32))}});
  const std::string msg = error_message_of([&] { layer.load(path); });
  EXPECT_TRUE(contains(msg, path + ": load_state_dict: 'bias' is stored as i32 but is f32 here")) << msg;
  EXPECT_EQ(layer.bias.to_vector<double>(), before) << "a refused load must leave the module as it was";
}

// ---------------------------------------------------------------- adapters

TEST(BadInputs, AdapterForAnotherBaseModelNamesTheWeightsFileAndBothShapes) {
  const std::string dir = fresh_dir("other_base_adapter");
  LoRAOptions lora;
  lora.r = 2;
  lora.target_modules = {"c_attn"};
  GPT wide(tiny_config());
  apply_lora(wide, lora);
  save_adapter(wide, dir);

  GPTConfig narrow_config = tiny_config();
  narrow_config.n_embd = 12;
  GPT narrow(narrow_config);
  const std::string msg = error_message_of([&] { load_adapter(narrow, dir); });
  EXPECT_TRUE(contains(msg, "load_adapter: " + dir + "/adapter_model.safetensors: ")) << msg;
  EXPECT_TRUE(contains(msg,
                       "'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight' has shape [2, 24] in the "
                       "file but [2, 12] in the model"))
      << msg;
  EXPECT_TRUE(lora_layers(narrow).empty()) << "a refused adapter must leave the model as it was";
}

// An adapter made for GPT-2 (c_attn) loaded into a Llama: its config's targets name modules the
// Llama lacks. The error names the adapter's files and the targets; the model is left untouched.
TEST(BadInputs, AdapterForAnotherArchitectureNamesTheFileAndTheTargets) {
  const std::string dir = fresh_dir("other_architecture_adapter");
  LoRAOptions lora;
  lora.r = 2;
  lora.target_modules = {"c_attn"};
  GPT gpt(tiny_config());
  apply_lora(gpt, lora);
  save_adapter(gpt, dir);

  Llama llama(tiny_llama_config());
  const std::string msg = error_message_of([&] { load_adapter(llama, dir); });
  EXPECT_TRUE(contains(msg, dir)) << msg;
  EXPECT_TRUE(contains(msg, "c_attn")) << msg;
  EXPECT_TRUE(lora_layers(llama).empty()) << "a refused adapter must leave the model as it was";
}

// ---------------------------------------------------------------- training checkpoints

struct Trainee {
  Linear layer{LinearOptions(2, 3)};
  AdamW optimizer{layer.parameters(), AdamWOptions()};
  TrainingState state() { return TrainingState{&layer, &optimizer, nullptr, nullptr, {}}; }
};

TEST(BadInputs, TrainingCheckpointWithoutOptimizerStateNamesTheFileAndTheMissingEntry) {
  const std::string path = fresh_dir("no_optimizer") + "/step-000000001.safetensors";
  Trainee trainee;
  save_training_checkpoint(path, TrainingState{&trainee.layer, nullptr, nullptr, nullptr, {}});
  TrainingState state = trainee.state();
  const std::string msg = error_message_of([&] { load_training_checkpoint(path, state); });
  EXPECT_TRUE(contains(msg, path + ": not a usable training checkpoint: AdamW::load_state_dict: the state has no "
                                   "'g0.p0.exp_avg'"))
      << msg;
}

TEST(BadInputs, TruncatedTrainingCheckpointNamesTheFileAndTheMissingBytes) {
  const std::string path = fresh_dir("truncated_checkpoint") + "/step-000000001.safetensors";
  Trainee trainee;
  TrainingState state = trainee.state();
  save_training_checkpoint(path, state);
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 10));  // as a copy cut short would leave it
  const std::string msg = error_message_of([&] { load_training_checkpoint(path, state); });
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "are out of the data section")) << msg;
}

TEST(BadInputs, TrainingCheckpointWithANonNumericValueNamesTheKey) {
  const std::string path = fresh_dir("bad_value") + "/step-000000001.safetensors";
  Trainee trainee;
  TrainingState state = trainee.state();
  state.extra = {{"step", 1}};
  save_training_checkpoint(path, state);
  SafetensorsFile file = load_safetensors(path);
  file.metadata["extra.step"] = "one";
  save_safetensors(path, file.tensors, file.metadata);
  const std::string msg = error_message_of([&] { load_training_checkpoint(path, state); });
  EXPECT_TRUE(contains(msg, path + ": not a usable training checkpoint: metadata 'extra.step' is 'one', not a number"))
      << msg;
}

TEST(BadInputs, TrainingCheckpointWithIntegerTensorsNamesTheFileTheTensorAndBothDtypes) {
  for (const std::string key : {"model.bias", "optim.g0.p0.exp_avg"}) {
    const std::string path = fresh_dir("integer_checkpoint") + "/step-000000001.safetensors";
    Trainee trainee;
    TrainingState state = trainee.state();
    save_training_checkpoint(path, state);
    SafetensorsFile file = load_safetensors(path);
    Tensor& t = file.tensors.at(key);
    t = full(t.shape(), 3.0, TensorOptions().dtype(DType::i32));
    save_safetensors(path, file.tensors, file.metadata);
    const std::string msg = error_message_of([&] { load_training_checkpoint(path, state); });
    EXPECT_TRUE(contains(msg, path + ": not a usable training checkpoint: ")) << msg;
    EXPECT_TRUE(contains(msg, "'" + key.substr(6) + "' is stored as i32 but is f32 here")) << msg;
  }
}

TEST(BadInputs, TrainingCheckpointOfAnotherModelListsTheMissingAndUnexpectedKeys) {
  const std::string path = fresh_dir("other_model") + "/step-000000001.safetensors";
  GPT gpt(tiny_config());
  save_training_checkpoint(path, TrainingState{&gpt, nullptr, nullptr, nullptr, {}});
  Trainee trainee;
  TrainingState state = trainee.state();
  const std::string msg = error_message_of([&] { load_training_checkpoint(path, state); });
  EXPECT_TRUE(contains(msg, path + ": not a usable training checkpoint: load_state_dict: missing keys: bias weight; "
                                   "unexpected keys: transformer.h.0.attn.c_attn.bias"))
      << msg;
  EXPECT_TRUE(contains(msg, " ... (20 more)")) << msg;  // 28 GPT tensors, 8 named
}

}  // namespace
}  // namespace mt::nn
