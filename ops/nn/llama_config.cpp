#include "ops/nn/llama_config.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_number.h"

namespace mt::nn {
namespace {

using json = nlohmann::json;
using detail::fail_file;

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_file(path, "cannot open the model config: ", std::strerror(errno));
  try {
    json j = json::parse(in);
    if (!j.is_object()) fail_file(path, "the model config must be a JSON object");
    return j;
  } catch (const json::exception& e) {
    fail_file(path, "the model config is not valid JSON: ", e.what());
  }
}

// One value as T; integers must be JSON integers in T's range (core/json_number.h).
template <typename T>
T value_as(const json& value, const char* key, const std::string& path) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const auto v = json_integer<T>(value);
    if (!v) fail_file(path, "\"", key, "\" is ", value.dump(), ", not an integer in range");
    return *v;
  } else {
    return value.get<T>();
  }
}

template <typename T>
T required(const json& j, const char* key, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) fail_file(path, "the config has no \"", key, "\"");
  return value_as<T>(*it, key, path);
}

template <typename T>
T optional(const json& j, const char* key, T fallback, const std::string& path) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : value_as<T>(*it, key, path);
}

std::optional<int64_t> optional_id(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  return json_integer<int64_t>(*it);  // a list of eos ids, or anything else: none chosen
}

// Rotary settings: transformers 5 writes "rope_parameters" {"rope_type", "rope_theta", ...}; earlier
// versions "rope_theta" and "rope_scaling" {"rope_type" (or "type"), ...}. Both are read.
void read_rope_scaling(const json& j, const std::string& path, LlamaConfig& c) {
  auto it = j.find("rope_parameters");
  if (it != j.end() && it->is_object()) {
    c.rope_theta = optional<double>(*it, "rope_theta", c.rope_theta, path);
  } else {
    it = j.find("rope_scaling");
  }
  if (it == j.end() || it->is_null()) return;
  const std::string type = optional<std::string>(*it, "rope_type", optional<std::string>(*it, "type", "", path), path);
  if (type == "default") return;
  if (type != "llama3") {
    fail_file(path, "rope_scaling of type \"", type, "\" is not supported (supported: none, \"default\", \"llama3\")");
  }
  RopeScaling s;
  s.factor = required<double>(*it, "factor", path);
  s.low_freq_factor = required<double>(*it, "low_freq_factor", path);
  s.high_freq_factor = required<double>(*it, "high_freq_factor", path);
  s.original_max_position_embeddings = required<int64_t>(*it, "original_max_position_embeddings", path);
  c.rope_scaling = s;
}

void read_unsupported(const json& j, const std::string& path) {
  const std::string act = optional<std::string>(j, "hidden_act", "silu", path);
  if (act != "silu") fail_file(path, "hidden_act \"", act, "\" is not supported (silu)");
  if (optional<bool>(j, "mlp_bias", false, path)) fail_file(path, "mlp_bias true is not supported");
  if (optional<int64_t>(j, "pretraining_tp", 1, path) != 1)
    fail_file(path, "pretraining_tp other than 1 is not supported");
  if (optional<double>(j, "attention_dropout", 0.0, path) != 0.0) {
    fail_file(path, "attention_dropout other than 0 is not supported");
  }
}

}  // namespace

void LlamaConfig::validate() const {
  const auto positive = [](const char* name, int64_t v) {
    MT_CHECK(v > 0, "LlamaConfig: ", name, " is ", v, "; it must be positive");
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("max_position_embeddings", max_position_embeddings);
  MT_CHECK(num_attention_heads % num_key_value_heads == 0, "LlamaConfig: num_attention_heads ", num_attention_heads,
           " is not a multiple of num_key_value_heads ", num_key_value_heads);
  MT_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0, "LlamaConfig: hidden_size ", hidden_size,
           " is not a multiple of num_attention_heads ", num_attention_heads, " and head_dim is not given");
  MT_CHECK(dim_per_head() % 2 == 0, "LlamaConfig: the head size ", dim_per_head(),
           " must be even for rotary embeddings");
  if (model_type == "qwen2") {
    MT_CHECK(attention_bias && !o_proj_bias, "LlamaConfig: qwen2 has biases on q, k and v and none on o");
  } else {
    MT_CHECK(attention_bias == o_proj_bias, "LlamaConfig: ", model_type, "'s attention_bias is on q, k, v and o alike");
  }
  MT_CHECK(rms_norm_eps > 0 && rope_theta > 0, "LlamaConfig: rms_norm_eps ", rms_norm_eps, " and rope_theta ",
           rope_theta, " must be positive");
}

LlamaConfig LlamaConfig::from_json_file(const std::string& path) {
  const json j = read_json(path);
  LlamaConfig c;
  try {
    c.model_type = required<std::string>(j, "model_type", path);
    if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2") {
      fail_file(path, "model_type \"", c.model_type, "\" is not a Llama-family model (llama, mistral, qwen2)");
    }
    c.vocab_size = required<int64_t>(j, "vocab_size", path);
    c.hidden_size = required<int64_t>(j, "hidden_size", path);
    c.intermediate_size = required<int64_t>(j, "intermediate_size", path);
    c.num_hidden_layers = required<int64_t>(j, "num_hidden_layers", path);
    c.num_attention_heads = required<int64_t>(j, "num_attention_heads", path);
    c.num_key_value_heads = optional<int64_t>(j, "num_key_value_heads", c.num_attention_heads, path);
    c.head_dim = optional<int64_t>(j, "head_dim", 0, path);
    c.rms_norm_eps = required<double>(j, "rms_norm_eps", path);
    c.rope_theta = optional<double>(j, "rope_theta", 10000.0, path);
    c.max_position_embeddings = required<int64_t>(j, "max_position_embeddings", path);
    c.tie_word_embeddings = optional<bool>(j, "tie_word_embeddings", false, path);
    c.bos_token_id = optional_id(j, "bos_token_id");
    c.eos_token_id = optional_id(j, "eos_token_id");
    read_rope_scaling(j, path, c);
    read_unsupported(j, path);
    if (c.model_type == "qwen2") {
      c.attention_bias = true;  // Qwen2: q, k and v have biases, o does not
    } else {
      c.attention_bias = c.o_proj_bias = optional<bool>(j, "attention_bias", false, path);
    }
    const bool windowed = c.model_type == "mistral" || optional<bool>(j, "use_sliding_window", false, path);
    if (windowed) {
      if (const auto w = j.find("sliding_window"); w != j.end() && !w->is_null()) {
        c.sliding_window = value_as<int64_t>(*w, "sliding_window", path);
      }
    }
  } catch (const json::exception& e) {
    fail_file(path, "a config field has the wrong type: ", e.what());
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail_file(path, e.what());
  }
  return c;
}

std::string LlamaConfig::to_json() const {
  json j = {{"architectures",
             {model_type == "qwen2"     ? "Qwen2ForCausalLM"
              : model_type == "mistral" ? "MistralForCausalLM"
                                        : "LlamaForCausalLM"}},
            {"model_type", model_type},
            {"vocab_size", vocab_size},
            {"hidden_size", hidden_size},
            {"intermediate_size", intermediate_size},
            {"num_hidden_layers", num_hidden_layers},
            {"num_attention_heads", num_attention_heads},
            {"num_key_value_heads", num_key_value_heads},
            {"head_dim", dim_per_head()},
            {"rms_norm_eps", rms_norm_eps},
            {"rope_theta", rope_theta},
            {"max_position_embeddings", max_position_embeddings},
            {"tie_word_embeddings", tie_word_embeddings},
            {"hidden_act", "silu"}};
  if (model_type != "qwen2") j["attention_bias"] = attention_bias;
  if (sliding_window) {
    j["sliding_window"] = *sliding_window;
    if (model_type == "qwen2") j["use_sliding_window"] = true;
  }
  if (rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  }
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_id) j["eos_token_id"] = *eos_token_id;
  return j.dump(2) + "\n";
}

std::string model_type_of(const std::string& config_path) {
  const json j = read_json(config_path);
  return optional<std::string>(j, "model_type", "", config_path);
}

}  // namespace mt::nn
