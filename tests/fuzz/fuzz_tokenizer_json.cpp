// libFuzzer target: the tokenizer.json reader on arbitrary bytes, and encode / decode with what
// it accepts. A FileError (any mt::Error) is the expected answer to a bad file; anything else is
// a bug, and so is an id outside the accepted tokenizer's vocabulary.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizers/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mt::fuzz::ScratchFile scratch("tokenizer.json");
  const std::string& path = scratch.write(data, size);
  try {
    const auto tokenizer = mt::tok::HfTokenizer::from_json_file(path);
    for (const char* text : {"Hello w\xC3\xB6rld 123!\n\t<|endoftext|> \xF0\x9F\x98\x80", "", "  a  "}) {
      const auto ids = tokenizer->encode(text, true);
      for (const auto id : ids) {
        if (id >= tokenizer->vocab_size()) mt::fuzz::fail("encode gave an id outside the vocabulary");
      }
      tokenizer->decode(ids);
    }
  } catch (const mt::Error&) {
  }
  return 0;
}
