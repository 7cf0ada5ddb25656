#include "ops/nn/hf_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace mt::nn {
namespace fs = std::filesystem;
using detail::fail_file;
using nlohmann::json;

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

// shard file -> the tensors the index maps to it
std::map<std::string, std::vector<std::string>> read_index(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_file(path, "cannot open the checkpoint index");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail_file(path, "the checkpoint index is not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    fail_file(path, "the checkpoint index has no \"weight_map\" object");
  }
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) fail_file(path, "weight_map[\"", tensor, "\"] is not a file name");
    const std::string name = shard.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      fail_file(path, "weight_map[\"", tensor, "\"] names '", name, "', which is not a file in the directory");
    }
    shards[name].push_back(tensor);
  }
  if (shards.empty()) fail_file(path, "the weight_map is empty");
  return shards;
}

}  // namespace

HfCheckpoint::HfCheckpoint(const std::string& dir) {
  const fs::path index = fs::path(dir) / kIndex, single = fs::path(dir) / kSingle;
  if (fs::exists(index)) {
    description_ = index.string();
    for (const auto& [shard, names] : read_index(description_)) {
      const fs::path path = fs::path(dir) / shard;
      if (!fs::exists(path)) fail_file(description_, "names the shard '", shard, "', which does not exist");
      SafetensorsFile file = load_safetensors(path.string());
      for (const auto& name : names) {
        auto it = file.tensors.find(name);
        if (it == file.tensors.end()) {
          fail_file(path.string(), "has no tensor '", name, "', which ", kIndex, " maps to it");
        }
        tensors_.emplace(name, std::move(it->second));
      }
    }
  } else if (fs::exists(single)) {
    description_ = single.string();
    tensors_ = load_safetensors(description_).tensors;
  } else {
    fail_file(dir, "holds neither ", kSingle, " nor ", kIndex);
  }
  for (const auto& [name, t] : tensors_) {
    if (is_floating(t.dtype())) {
      dtype_ = t.dtype();
      break;
    }
  }
}

DType hf_checkpoint_dtype(const std::string& dir) {
  const fs::path index = fs::path(dir) / kIndex, single = fs::path(dir) / kSingle;
  std::vector<std::string> files;
  if (fs::exists(index)) {
    for (const auto& [shard, names] : read_index(index.string())) files.push_back((fs::path(dir) / shard).string());
  } else if (fs::exists(single)) {
    files.push_back(single.string());
  } else {
    fail_file(dir, "holds neither ", kSingle, " nor ", kIndex);
  }
  // HfCheckpoint's rule: the dtype of the first floating tensor in name order.
  std::map<std::string, DType> dtypes;
  for (const std::string& file : files) {
    for (const auto& [name, info] : read_safetensors_header(file).tensors) dtypes.emplace(name, info.first);
  }
  for (const auto& [name, dtype] : dtypes) {
    if (is_floating(dtype)) return dtype;
  }
  return DType::f32;
}

void save_hf_checkpoint(const std::string& dir, const std::map<std::string, Tensor>& state, int64_t max_shard_bytes) {
  MT_CHECK(max_shard_bytes > 0, "save_hf_checkpoint: max_shard_bytes must be positive");
  for (const auto& [name, t] : state) {
    MT_CHECK_T(DTypeError, t.dtype() != DType::f8e4m3 && t.dtype() != DType::f8e5m2, "save_hf_checkpoint: ", dir, ": '",
               name, "' is ", dtype_name(t.dtype()),
               ", an FP8 frozen base (nn::quantize_linears_fp8); a Hugging Face checkpoint is written from the "
               "high-precision weights: save the adapter alone (save_adapter) and merge it into the original base "
               "with mt_merge");
  }
  std::vector<std::map<std::string, Tensor>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : state) {
    const auto bytes = static_cast<int64_t>(t.nbytes());
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back()[name] = t;
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    save_safetensors((fs::path(dir) / kSingle).string(), shards[0], metadata);
    return;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    save_safetensors((fs::path(dir) / name).string(), shards[i], metadata);
    for (const auto& [tensor, t] : shards[i]) index["weight_map"][tensor] = name;
  }
  write_file_atomically((fs::path(dir) / kIndex).string(), "checkpoint index", index.dump(2) + "\n");
}

}  // namespace mt::nn
