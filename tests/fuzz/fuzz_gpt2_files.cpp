// libFuzzer target: GPT-2's vocab.json + merges.txt reader on arbitrary bytes (the input is cut at
// its first NUL byte into the two files), and encode / decode with what it accepts.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizers/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mt::fuzz::ScratchFile vocab("vocab.json"), merges("merges.txt");
  const auto* cut = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t vocab_size = cut ? static_cast<size_t>(cut - data) : size;
  const std::string& vocab_path = vocab.write(data, vocab_size);
  const std::string& merges_path = merges.write(cut ? cut + 1 : data + size, cut ? size - vocab_size - 1 : 0);
  try {
    const auto tokenizer = mt::tok::HfTokenizer::from_gpt2_files(vocab_path, merges_path);
    const auto ids = tokenizer->encode("Hello world, 42 times.<|endoftext|>");
    for (const auto id : ids) {
      if (id >= tokenizer->vocab_size()) mt::fuzz::fail("encode gave an id outside the vocabulary");
    }
    tokenizer->decode(ids);
  } catch (const mt::Error&) {
  }
  return 0;
}
