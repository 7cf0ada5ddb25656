// libFuzzer target: encode on arbitrary bytes with the fixture tokenizers (GPT-2 and Llama 3
// byte-level BPE, Metaspace BPE with byte fallback). Encoding never fails; every id is in the
// vocabulary; and byte-level BPE decodes back to the input with invalid UTF-8 replaced
// (tokenizers/utf8.h), whatever the bytes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "tokenizers/tokenizer.h"
#include "tokenizers/utf8.h"

namespace {

struct Fixture {
  std::unique_ptr<mt::tok::Tokenizer> tokenizer;
  bool lossless;  // decode(encode(s)) == replace_invalid_utf8(s)
};

const std::vector<Fixture>& fixtures() {
  static const std::vector<Fixture> all = [] {
    std::vector<Fixture> v;
    const std::string dir = MT_FIXTURE_DIR;
    v.push_back({mt::tok::load_tokenizer(dir + "/gpt2/tokenizer.json"), true});
    v.push_back({mt::tok::load_tokenizer(dir + "/llama3/tokenizer.json"), true});
    v.push_back({mt::tok::load_tokenizer(dir + "/metaspace/tokenizer.json"), false});
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const auto& f : fixtures()) {
    const auto ids = f.tokenizer->encode(text, true);
    for (const auto id : ids) {
      if (id >= f.tokenizer->vocab_size()) mt::fuzz::fail("encode gave an id outside the vocabulary");
    }
    const std::string decoded = f.tokenizer->decode(f.tokenizer->encode(text));
    if (f.lossless && decoded != mt::tok::replace_invalid_utf8(text)) {
      mt::fuzz::fail(f.tokenizer->description() + ": decode(encode(s)) differs from s");
    }
    if (!mt::tok::is_valid_utf8(decoded)) mt::fuzz::fail("decode gave invalid UTF-8");
  }
  return 0;
}
