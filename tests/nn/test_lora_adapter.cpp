// LoRA adapter files (PEFT's adapter_config.json and adapter_model.safetensors): saving and
// loading with bitwise outputs, dtype conversion, regex targets, and every error path of
// save_adapter / load_adapter (each checked to leave the model unchanged); then the config
// reader on its own.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "core/safetensors.h"
#include "ops/nn/adapter_config.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "tests/nn/lora_test_util.h"
#include "tests/test_util.h"

namespace mt::nn {
namespace {

using namespace lora_test;

namespace fs = std::filesystem;
using Json = nlohmann::json;

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
