// libFuzzer target: the token-file reader (MTTOKENS versions 1 and 2 with or without a loss
// mask and example starts, llm.c's .bin shards) on arbitrary bytes. A FileError (any mt::Error) is the expected
// answer to a bad file; anything else is a bug in the reader, and so is an accepted file that
// breaks a promise of core/data/token_file.h.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/data/token_file.h"
#include "core/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Checks what an opened file promises: its width, every token below vocab_size (read through
// every accessor), mask bytes of 0 or 1, and example starts from 0, increasing, below size().
void check_accepted(const mt::data::TokenFile& file) {
  const int width = file.bytes_per_token();
  if (width != 2 && width != 4) mt::fuzz::fail("bytes_per_token is neither 2 nor 4");
  if ((file.u16_tokens() != nullptr) != (width == 2) || (file.u32_tokens() != nullptr) != (width == 4)) {
    mt::fuzz::fail("the typed token pointers disagree with bytes_per_token");
  }
  if (file.size() < 1) mt::fuzz::fail("a file of zero tokens was accepted");
  std::vector<int64_t> copied(static_cast<size_t>(file.size()));
  file.copy_tokens(0, file.size(), copied.data());
  for (int64_t i = 0; i < file.size(); ++i) {
    if (file.token(i) >= file.vocab_size()) mt::fuzz::fail("a token not below vocab_size was accepted");
    if (copied[static_cast<size_t>(i)] != file.token(i)) mt::fuzz::fail("copy_tokens disagrees with token(i)");
  }
  if (file.format() == mt::data::TokenFileFormat::llmc_shard && width != 2) {
    mt::fuzz::fail("an llm.c shard was read with 4 bytes per token");
  }
  for (int64_t i = 0; file.has_loss_mask() && i < file.size(); ++i) {
    if (file.loss_mask()[i] > 1) mt::fuzz::fail("a loss mask byte other than 0 or 1 was accepted");
  }
  if (file.num_examples() < 0 || file.has_example_starts() != (file.num_examples() > 0)) {
    mt::fuzz::fail("num_examples disagrees with has_example_starts");
  }
  if (file.has_example_starts() && file.format() != mt::data::TokenFileFormat::mttokens_v2) {
    mt::fuzz::fail("example starts were read from a file other than MTTOKENS version 2");
  }
  int64_t covered = 0;  // the examples must tile [0, size()) without gaps or overlaps
  for (int64_t e = 0; e < file.num_examples(); ++e) {
    if (file.example_start(e) != covered) mt::fuzz::fail("an example does not start where the one before ends");
    if (file.example_end(e) <= file.example_start(e)) mt::fuzz::fail("an empty or reversed example was accepted");
    covered = file.example_end(e);
  }
  if (file.has_example_starts() && covered != file.size()) mt::fuzz::fail("the examples do not end at size()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mt::fuzz::ScratchFile scratch("mt_fuzz_token_file");
  const std::string& path = scratch.write(data, size);
  // Once as a caller without a vocabulary would open it, once expecting one taken from the
  // input's last byte, so llm.c shards are checked against vocabularies small enough to fail.
  const std::optional<int64_t> expectations[] = {std::nullopt, size > 0 ? 1 + data[size - 1] * 97 : 1};
  for (const std::optional<int64_t>& expected : expectations) {
    try {
      const mt::data::TokenFile file(path, expected);
      check_accepted(file);
      if (expected && file.vocab_size() != *expected) mt::fuzz::fail("the expected vocab_size was not kept");
    } catch (const mt::Error&) {
    }
  }
  return 0;
}
