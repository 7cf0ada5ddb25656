// libFuzzer target: load_safetensors on arbitrary bytes. A FileError (any mt::Error) is
// the expected answer to a bad file; anything else (another exception, a crash, a
// sanitizer report, a leak) is a bug in the reader.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mt::fuzz::ScratchFile scratch("mt_fuzz_safetensors");
  try {
    const mt::SafetensorsFile file = mt::load_safetensors(scratch.write(data, size));
    // Read every byte of every tensor, so a tensor whose storage is smaller than its
    // shape claims shows up as an out-of-bounds read.
    unsigned checksum = 0;
    for (const auto& [name, t] : file.tensors) {
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < t.nbytes(); ++i) checksum += bytes[i];
    }
    if (checksum == 0xFFFFFFFFu) return 0;  // keeps the reads from being optimised away
  } catch (const mt::Error&) {
  }
  return 0;
}
