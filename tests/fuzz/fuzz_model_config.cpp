// libFuzzer target: the Llama-family config.json reader and the sharded checkpoint index reader
// (model.safetensors.index.json) on arbitrary bytes. The index lives in a scratch directory that
// also holds one small valid shard, "a.safetensors" with tensor "w", so that indexes naming it get
// as far as reading it. A FileError (any mt::Error) is the expected answer to bad input; an
// accepted config must validate, and an accepted index must give the tensors it maps.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/safetensors.h"
#include "ops/nn/hf_checkpoint.h"
#include "ops/nn/llama_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

std::string scratch_dir() {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/mt-fuzz-index." + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  mt::save_safetensors(dir + "/a.safetensors", {{"w", mt::zeros({2, 3})}});
  return dir;
}

void write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) mt::fuzz::fail("cannot write " + path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = scratch_dir();
  write(dir + "/config.json", data, size);
  try {
    mt::nn::LlamaConfig::from_json_file(dir + "/config.json").validate();
  } catch (const mt::Error&) {
  }
  write(dir + "/model.safetensors.index.json", data, size);
  try {
    const mt::nn::HfCheckpoint checkpoint(dir);
    for (const auto& [name, t] : checkpoint.tensors()) {
      if (name != "w" || t.numel() != 6) mt::fuzz::fail("an index gave a tensor its shard does not hold: " + name);
    }
  } catch (const mt::Error&) {
  }
  return 0;
}
