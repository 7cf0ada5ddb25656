// LoRA options and the reader of PEFT's adapter_config.json.
//
// The reader takes what PEFT writes for a LoRA adapter (peft_type "LORA", r, lora_alpha,
// lora_dropout, use_rslora, target_modules as a list or a regex string) and refuses every
// setting that would change the adapter's meaning and is not supported (DoRA, per-layer
// ranks or alphas, trained biases, layer selection, modules_to_save, ...), and JSON nested
// deeper than 64 levels. Every failure throws FileError whose message reads
// "load_adapter: <path>: <problem>".
//
// It depends on core/error.h and nlohmann/json only, so it can be built and tested (and
// fuzzed) without the rest of the ops library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::nn {

struct LoRAOptions {
  int64_t r = 8;       // rank
  double alpha = 16;   // lora_alpha
  double dropout = 0;  // on the branch's input while training, in [0, 1)
  bool use_rslora = false;
  // PEFT's list form: a path equal to a name or ending with "." + name.
  std::vector<std::string> target_modules;
  // PEFT's string form, used instead of target_modules when non-empty: a regex
  // (ECMAScript, std::regex) that must match the whole path.
  std::string target_regex;
};

// The LoRA options in `json_text`, the content of an adapter_config.json; `path` is only
// used in error messages.
LoRAOptions parse_adapter_config(const std::string& json_text, const std::string& path);

// Reads `path` and parses it as above; a missing or unreadable file is a FileError too.
LoRAOptions read_adapter_config(const std::string& path);

}  // namespace mt::nn

namespace mt::detail {
// Throws FileError("load_adapter: <path>: <problem>"), the form of every adapter loading error
// (this reader's and ops/nn/lora.cpp's).
[[noreturn]] void fail_adapter_file(const std::string& path, const std::string& problem);
}  // namespace mt::detail
