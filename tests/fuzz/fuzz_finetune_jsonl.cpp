// libFuzzer target: the JSONL readers on arbitrary bytes: each line as a text document's field,
// a prompt/completion example and a messages example. A FileError (any mt::Error) is the answer
// to a bad line; an accepted example must have one mask byte per id, each 0 or 1.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizers/finetune_data.h"
#include "tokenizers/text_sources.h"
#include "tokenizers/tokenizer.h"

namespace {

void check(const mt::tok::MaskedIds& e) {
  if (e.ids.size() != e.loss_mask.size()) mt::fuzz::fail("ids and loss mask differ in length");
  for (const auto m : e.loss_mask) {
    if (m > 1) mt::fuzz::fail("a loss mask byte other than 0 or 1");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer = mt::tok::load_tokenizer(std::string(MT_FIXTURE_DIR) + "/gpt2");
  static const auto roles = mt::tok::RoleTemplate::parse({"user=U: {content}\\n", "assistant=A: {content}\\n"});
  const std::string text(reinterpret_cast<const char*>(data), size);
  size_t line_number = 0;
  for (size_t begin = 0; begin <= text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    ++line_number;
    try {
      mt::tok::jsonl_string_field(line, "text", "fuzz.jsonl", line_number);
    } catch (const mt::Error&) {
    }
    try {
      check(mt::tok::encode_prompt_completion(*tokenizer, line, "fuzz.jsonl", line_number));
    } catch (const mt::Error&) {
    }
    try {
      check(mt::tok::encode_messages(*tokenizer, roles, line, "fuzz.jsonl", line_number));
    } catch (const mt::Error&) {
    }
    begin = end + 1;
  }
  return 0;
}
