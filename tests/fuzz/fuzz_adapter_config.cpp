// libFuzzer target: the PEFT adapter_config.json reader on arbitrary text. A FileError
// (any mt::Error) is the expected answer to a bad config; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "ops/nn/adapter_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    mt::nn::parse_adapter_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz/adapter_config.json");
  } catch (const mt::Error&) {
  }
  return 0;
}
