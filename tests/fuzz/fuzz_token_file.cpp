// libFuzzer target: the MTTOKENS token-file reader on arbitrary bytes. A FileError (any
// mt::Error) is the expected answer to a bad file; anything else is a bug in the reader.
#include <cstddef>
#include <cstdint>

#include "core/data/token_file.h"
#include "core/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mt::fuzz::ScratchFile scratch("mt_fuzz_token_file");
  try {
    const mt::data::TokenFile file(scratch.write(data, size));
    // The reader promises every token is below vocab_size; a token that is not means
    // its validation let a corrupt file through.
    for (int64_t i = 0; i < file.size(); ++i) {
      if (file.data()[i] >= file.vocab_size()) mt::fuzz::fail("a token not below vocab_size was accepted");
    }
  } catch (const mt::Error&) {
  }
  return 0;
}
