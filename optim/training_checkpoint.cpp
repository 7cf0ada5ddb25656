#include "optim/training_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "ops/nn/fp8_state_dict.h"

namespace mt {

namespace {

constexpr const char* kFormat = "mixtrain-training-checkpoint-1";

std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::vector<Device> generator_devices() {
  std::vector<Device> out = {kCPU};
  for (int d = 0; d < cuda::device_count(); ++d) out.emplace_back(DeviceType::cuda, d);
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw FileError(path + ": not a usable training checkpoint: " + what);
}

// The "<prefix><key>" metadata entries, as numbers.
std::map<std::string, double> numbers_with_prefix(const std::string& path,
                                                  const std::map<std::string, std::string>& meta,
                                                  const std::string& prefix) {
  std::map<std::string, double> out;
  for (const auto& [key, text] : meta) {
    if (key.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') fail(path, "metadata '" + key + "' is '" + text + "', not a number");
    out[key.substr(prefix.size())] = v;
  }
  return out;
}

}  // namespace

void save_training_checkpoint(const std::string& path, const TrainingState& state) {
  MT_CHECK(state.model != nullptr, "save_training_checkpoint: no model");
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : state.model->state_dict()) tensors["model." + name] = t;
  if (state.optimizer) {
    for (const auto& [name, t] : state.optimizer->state_dict()) tensors["optim." + name] = t;
  }
  for (const auto& [name, t] : nn::fp8_state_dict(*state.model)) tensors["fp8." + name] = t;
  std::map<std::string, std::string> meta = {{"format", kFormat}};
  if (state.scaler) {
    for (const auto& [k, v] : state.scaler->state_dict()) meta["scaler." + k] = exact(v);
  }
  if (state.scheduler) {
    for (const auto& [k, v] : state.scheduler->state_dict()) meta["scheduler." + k] = exact(v);
  }
  for (const Device& d : generator_devices()) {
    const Generator& g = default_generator(d);
    meta["rng." + d.str()] = std::to_string(g.seed()) + " " + std::to_string(g.offset());
  }
  for (const auto& [k, v] : state.extra) meta["extra." + k] = exact(v);
  save_safetensors(path, tensors, meta);
}

void load_training_checkpoint(const std::string& path, TrainingState& state) {
  MT_CHECK(state.model != nullptr, "load_training_checkpoint: no model");
  const SafetensorsFile file = load_safetensors(path);
  const auto format = file.metadata.find("format");
  if (format == file.metadata.end() || format->second != kFormat) {
    fail(path, "metadata 'format' is '" + (format == file.metadata.end() ? std::string("(missing)") : format->second) +
                   "', expected '" + kFormat + "'");
  }
  std::map<std::string, Tensor> model, optim, fp8;
  for (const auto& [name, t] : file.tensors) {
    if (name.rfind("model.", 0) == 0) {
      model[name.substr(6)] = t;
    } else if (name.rfind("optim.", 0) == 0) {
      optim[name.substr(6)] = t;
    } else if (name.rfind("fp8.", 0) == 0) {
      fp8[name.substr(4)] = t;
    } else {
      fail(path, "unexpected tensor '" + name + "'");
    }
  }
  const auto scaler = numbers_with_prefix(path, file.metadata, "scaler.");
  const auto scheduler = numbers_with_prefix(path, file.metadata, "scheduler.");
  const auto extra = numbers_with_prefix(path, file.metadata, "extra.");
  std::vector<std::pair<Device, std::pair<uint64_t, uint64_t>>> rng;
  for (const Device& d : generator_devices()) {
    const auto it = file.metadata.find("rng." + d.str());
    if (it == file.metadata.end()) continue;  // saved on a machine with fewer GPUs
    unsigned long long seed = 0, offset = 0;
    if (std::sscanf(it->second.c_str(), "%llu %llu", &seed, &offset) != 2) {
      fail(path, "metadata 'rng." + d.str() + "' is '" + it->second + "', not '<seed> <offset>'");
    }
    rng.push_back({d, {seed, offset}});
  }
  try {
    NoGradGuard no_grad;
    state.model->load_state_dict(model, /*strict=*/true);
    nn::load_fp8_state_dict(*state.model, fp8);  // none saved: the layers start without, as the saved run did
    if (state.optimizer) state.optimizer->load_state_dict(optim);
    if (state.scaler) state.scaler->load_state_dict(scaler);
    if (state.scheduler) state.scheduler->load_state_dict(scheduler);
  } catch (const FileError&) {
    throw;
  } catch (const Error& e) {
    fail(path, e.what());
  }
  for (const auto& [device, so] : rng) {
    Generator& g = default_generator(device);
    g.manual_seed(so.first);
    g.set_offset(so.second);
  }
  state.extra = extra;
}

CheckpointDirectory::CheckpointDirectory(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {
  MT_CHECK(keep >= 1, "CheckpointDirectory: keep must be at least 1, got ", keep);
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw FileError(dir_ + ": cannot create the checkpoint directory: " + ec.message());
  // Temporary files of writes a crash interrupted ("step-N.safetensors.tmp.<pid>"): never read,
  // and one trainer owns the directory, so they can go.
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find(".safetensors.tmp.") != std::string::npos) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

std::vector<std::string> CheckpointDirectory::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    long long step = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "step-%lld.safetensors%n", &step, &used) == 1 &&
        used == static_cast<int>(name.size())) {
      found.emplace_back(step, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::optional<std::string> CheckpointDirectory::latest() const {
  const std::vector<std::string> all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string CheckpointDirectory::save(int64_t step, const TrainingState& state) {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%09lld.safetensors", static_cast<long long>(step));
  const std::string path = (std::filesystem::path(dir_) / name).string();
  save_training_checkpoint(path, state);
  const std::vector<std::string> all = list();
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) std::filesystem::remove(all[i]);
  return path;
}

}  // namespace mt
