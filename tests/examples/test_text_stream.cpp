// lm_example::TextStream, what mt_generate prints as tokens are drawn (Note [Streaming decoded
// text] in examples/lm/trainer.cpp): no piece ends inside a UTF-8 character while more tokens may
// come, the pieces add up to the text of all the ids, and a sequence that cannot become a
// character is given out as it is.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "examples/lm/trainer.h"
#include "tokenizers/regex.h"
#include "tokenizers/tokenizer.h"
#include "tokenizers/utf8.h"

namespace lm_example {
namespace {

// The bytes of `text` as the byte tokenizer's ids.
std::vector<int64_t> byte_ids(const std::string& text) {
  std::vector<int64_t> ids;
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// The pieces of `ids` added one at a time, then finish().
std::vector<std::string> pieces_of(TextStream& stream, const std::vector<int64_t>& ids) {
  std::vector<std::string> pieces;
  for (const int64_t id : ids) pieces.push_back(stream.add({id}));
  pieces.push_back(stream.finish());
  return pieces;
}

TEST(TextStream, MultiByteCharactersComeWholeFromTheByteTokenizer) {
  const auto bytes = mt::tok::load_tokenizer("bytes");
  for (const std::string character : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}) {  // é € 😀
    TextStream stream(*bytes);
    EXPECT_EQ(stream.add(byte_ids("a")), "a");
    const std::vector<int64_t> ids = byte_ids(character);
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      EXPECT_EQ(stream.add({ids[i]}), "") << "byte " << i << " of a " << ids.size() << "-byte character";
    }
    EXPECT_EQ(stream.add({ids.back()}), character);
    EXPECT_EQ(stream.finish(), "");
    EXPECT_EQ(stream.text(), "a" + character);
  }
}

TEST(TextStream, BytesThatCannotBecomeACharacterAreGivenOutAsTheyAre) {
  const auto bytes = mt::tok::load_tokenizer("bytes");
  TextStream stream(*bytes);
  EXPECT_EQ(stream.add({0xC3}), "");  // may still become é
  EXPECT_EQ(stream.add(byte_ids("b")),
            "\xC3"
            "b");  // cannot any more
  EXPECT_EQ(stream.add({0xE2, 0x82}), "");
  EXPECT_EQ(stream.finish(), "\xE2\x82");  // the end: no token will complete it
  EXPECT_EQ(stream.text(),
            "\xC3"
            "b\xE2\x82");
}

TEST(TextStream, ControlCharactersAreEscapedAndIdsOutsideTheTokenizerSkipped) {
  const auto bytes = mt::tok::load_tokenizer("bytes");
  TextStream stream(*bytes);
  EXPECT_EQ(stream.add(byte_ids("a\x1b\n\tb\x7f")), "a\\x1b\n\tb\\x7f");
  EXPECT_EQ(stream.add({256, 1000}), "");  // a padded embedding's rows: not text
  EXPECT_EQ(stream.add(byte_ids("c")), "c");
  EXPECT_EQ(stream.text(), "a\\x1b\n\tb\\x7fc");
}

TEST(TextStream, ThePiecesAddUpToTheTextOfAllTheIds) {
  const auto bytes = mt::tok::load_tokenizer("bytes");
  std::mt19937 random(7);
  std::vector<int64_t> ids;
  std::string expected;
  for (int i = 0; i < 2000; ++i) {
    // Mostly UTF-8 lead and continuation bytes, so that valid and broken characters both occur.
    const int64_t id = static_cast<int64_t>(random() % 4 == 0 ? 0x20 + random() % 0x5f : 0x80 + random() % 0x78);
    ids.push_back(id);
    expected += static_cast<char>(id);
  }
  TextStream stream(*bytes);
  std::string joined;
  for (const std::string& piece : pieces_of(stream, ids)) joined += piece;
  EXPECT_EQ(joined, expected);
  EXPECT_EQ(stream.text(), expected);
}

// Byte-level BPE decodes bytes that are not a character yet as U+FFFD: held back, not printed.
TEST(TextStream, ByteLevelBpeTokensOfOneCharacterComeOutAsIt) {
  if (!mt::tok::have_regex_engine()) GTEST_SKIP() << "built without PCRE2";
  const auto gpt2 = mt::tok::load_tokenizer(std::string(MT_FIXTURE_DIR) + "/gpt2");
  // GPT-2's byte-level alphabet spells the bytes C3 and A9 of "é" as "Ã" and "©".
  const auto c3 = gpt2->token_to_id("\xC3\x83"), a9 = gpt2->token_to_id("\xC2\xA9");
  ASSERT_TRUE(c3 && a9);
  TextStream stream(*gpt2);
  EXPECT_EQ(stream.add({*c3}), "");
  EXPECT_EQ(stream.add({*a9}), "\xC3\xA9");

  const std::string text = "caf\xC3\xA9 \xE2\x82\xAC 42 \xF0\x9F\x98\x80 na\xC3\xAFve";
  const std::vector<mt::tok::TokenId> encoded = gpt2->encode(text);
  TextStream again(*gpt2);
  std::string joined;
  for (const std::string& piece : pieces_of(again, std::vector<int64_t>(encoded.begin(), encoded.end()))) {
    EXPECT_TRUE(mt::tok::is_valid_utf8(piece)) << "piece '" << piece << "' of '" << text << "'";
    joined += piece;
  }
  EXPECT_EQ(joined, text);
}

}  // namespace
}  // namespace lm_example
