#include "ops/nn/adapter_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace mt::nn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

using detail::fail_adapter_file;

// True when `key` is absent or holds a value meaning "off" for PEFT.
bool absent_or_off(const Json& j, const char* key) {
  if (!j.contains(key)) return true;
  const Json& v = j.at(key);
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
         (v.is_array() && v.empty());
}

// nlohmann's parser does not recurse, but dump() (which error messages use) does, once per
// level: a few hundred kilobytes of "[[[[" would overflow the stack. A PEFT config nests
// a few levels at most.
constexpr int kMaxJsonDepth = 64;

Json parse_json(const std::string& text, const std::string& path) {
  const Json::parser_callback_t limit_depth = [&](int depth, Json::parse_event_t event, const Json&) {
    const bool opens = event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    if (opens && depth >= kMaxJsonDepth)
      fail_adapter_file(path, "JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  try {
    return Json::parse(text, limit_depth);
  } catch (const Json::exception& e) {
    // parse_error for the syntax, out_of_range for a number beyond a double ("1e999").
    fail_adapter_file(path, std::string("malformed JSON: ") + e.what());
  }
}

void read_targets(const Json& j, const std::string& path, LoRAOptions& o) {
  if (!j.contains("target_modules") || j.at("target_modules").is_null())
    fail_adapter_file(path,
                      "target_modules is missing or null; give the module names (PEFT infers them per model type)");
  const Json& t = j.at("target_modules");
  if (t.is_string()) {
    o.target_regex = t.get<std::string>();
    if (o.target_regex.empty()) fail_adapter_file(path, "target_modules is an empty string");
    return;
  }
  if (!t.is_array() || t.empty())
    fail_adapter_file(path, "target_modules must be a non-empty list of strings or a string");
  for (const Json& name : t) {
    if (!name.is_string() || name.get<std::string>().empty())
      fail_adapter_file(path, "target_modules must hold non-empty strings, got " + name.dump());
    o.target_modules.push_back(name.get<std::string>());
  }
}

}  // namespace

LoRAOptions parse_adapter_config(const std::string& json_text, const std::string& path) {
  const Json j = parse_json(json_text, path);
  if (!j.is_object()) fail_adapter_file(path, "expected a JSON object, got " + std::string(j.type_name()));
  const std::string peft_type = j.contains("peft_type") && j.at("peft_type").is_string()
                                    ? j.at("peft_type").get<std::string>()
                                    : (j.contains("peft_type") ? j.at("peft_type").dump() : "missing");
  if (peft_type != "LORA") fail_adapter_file(path, "peft_type is " + peft_type + ", expected \"LORA\"");
  LoRAOptions o;
  if (!j.contains("r") || !j.at("r").is_number_integer() || j.at("r").get<int64_t>() <= 0)
    fail_adapter_file(path, "r must be a positive integer, got " + (j.contains("r") ? j.at("r").dump() : "nothing"));
  o.r = j.at("r").get<int64_t>();
  if (!j.contains("lora_alpha") || !j.at("lora_alpha").is_number())
    fail_adapter_file(
        path, "lora_alpha must be a number, got " + (j.contains("lora_alpha") ? j.at("lora_alpha").dump() : "nothing"));
  o.alpha = j.at("lora_alpha").get<double>();
  if (j.contains("lora_dropout")) {
    const Json& d = j.at("lora_dropout");
    if (!d.is_number() || d.get<double>() < 0 || d.get<double>() >= 1)
      fail_adapter_file(path, "lora_dropout must be a number in [0, 1), got " + d.dump());
    o.dropout = d.get<double>();
  }
  if (j.contains("use_rslora")) {
    if (!j.at("use_rslora").is_boolean())
      fail_adapter_file(path, "use_rslora must be a boolean, got " + j.at("use_rslora").dump());
    o.use_rslora = j.at("use_rslora").get<bool>();
  }
  read_targets(j, path, o);
  if (j.contains("bias") && j.at("bias") != "none")
    fail_adapter_file(path, "bias is " + j.at("bias").dump() + "; only \"none\" is supported (no trained biases)");
  for (const char* key : {"use_dora", "rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save",
                          "exclude_modules", "lora_bias", "layer_replication"}) {
    if (!absent_or_off(j, key))
      fail_adapter_file(path, std::string(key) + " is " + j.at(key).dump() + ", which is not supported");
  }
  return o;
}

LoRAOptions read_adapter_config(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail_adapter_file(path,
                      "does not exist (an adapter directory holds adapter_config.json and adapter_model.safetensors)");
  std::ifstream in(path);
  if (!in) fail_adapter_file(path, "cannot be opened for reading");
  std::stringstream text;
  text << in.rdbuf();
  return parse_adapter_config(text.str(), path);
}

}  // namespace mt::nn

namespace mt::detail {

void fail_adapter_file(const std::string& path, const std::string& problem) {
  fail_file("load_adapter: " + path, problem);
}

}  // namespace mt::detail
