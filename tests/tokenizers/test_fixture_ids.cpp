// Our ids against the committed ids of Hugging Face's tokenizers and SentencePiece
// (tests/fixtures/tokenizers/expected.jsonl), for every fixture tokenizer and case: encode with
// and without special tokens, and decode. check_ids.sh repeats the comparison against the
// Python libraries themselves where they are installed.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "tests/tokenizers/fixture_cases.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/regex.h"
#include "tokenizers/sentencepiece_tokenizer.h"
#include "tokenizers/tokenizer.h"
#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

const std::string kDir = MT_FIXTURE_DIR;

std::string window(const std::vector<TokenId>& ids, size_t at) {
  std::string out;
  for (size_t i = at > 3 ? at - 3 : 0; i < std::min(ids.size(), at + 4); ++i) out += std::to_string(ids[i]) + " ";
  return out;
}

void expect_same_ids(const std::vector<TokenId>& ours, const std::vector<TokenId>& theirs, const std::string& what) {
  size_t i = 0;
  while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i]) ++i;
  EXPECT_TRUE(i == ours.size() && i == theirs.size())
      << what << ": first difference at " << i << " of " << ours.size() << " / " << theirs.size() << ": ours ["
      << window(ours, i) << "] theirs [" << window(theirs, i) << "]";
}

class FixtureIds : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureIds, EqualHuggingFaceAndSentencePiece) {
  const std::string name = GetParam();
  if (!have_regex_engine() && name != "sentencepiece") GTEST_SKIP() << "built without PCRE2";
  if (!have_sentencepiece() && name == "sentencepiece") GTEST_SKIP() << "built without SentencePiece";
  const auto tokenizer = load_tokenizer(kDir + "/" + fixtures::tokenizer_files().at(name));
  std::map<std::string, std::string> texts;
  for (const auto& c : fixtures::read_cases(kDir + "/cases.jsonl")) texts[c.name] = c.text;
  std::ifstream expected(kDir + "/expected.jsonl");
  int compared = 0;
  for (std::string line; std::getline(expected, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("tokenizer") != name) continue;
    const std::string& text = texts.at(j.at("name").get<std::string>());
    const std::string what = name + " / " + j.at("name").get<std::string>();
    const auto ids = tokenizer->encode(text);
    expect_same_ids(ids, j.at("ids").get<std::vector<TokenId>>(), what + " (encode)");
    expect_same_ids(tokenizer->encode(text, true), j.at("ids_special").get<std::vector<TokenId>>(),
                    what + " (encode with special tokens)");
    EXPECT_EQ(fixtures::to_hex(tokenizer->decode(j.at("ids").get<std::vector<TokenId>>())), j.at("decoded_hex"))
        << what << " (decode)";
    // Round trips where Hugging Face's do, on the text as encoded: invalid UTF-8 replaced first.
    if (j.at("roundtrip").get<bool>())
      EXPECT_EQ(tokenizer->decode(ids), replace_invalid_utf8(text)) << what << " (round trip)";
    ++compared;
  }
  EXPECT_GE(compared, 40) << name;
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, FixtureIds,
                         ::testing::Values("gpt2", "gpt2-files", "llama3", "metaspace", "sentencepiece",
                                           "sentencepiece-json"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace mt::tok
