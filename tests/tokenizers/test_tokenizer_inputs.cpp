// Bad tokenizer files, bad JSONL, the invalid UTF-8 policy, special tokens, parallel encoding
// and fine-tuning masks.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_util.h"
#include "tokenizers/encode_parallel.h"
#include "tokenizers/finetune_data.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/regex.h"
#include "tokenizers/text_sources.h"
#include "tokenizers/tokenizer.h"
#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = MT_FIXTURE_DIR;

class TokenizerInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_regex_engine()) GTEST_SKIP() << "built without PCRE2";
    dir_ = fs::temp_directory_path() / ("mt_tokenizer_inputs_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    write_bytes(path, text);
    return path;
  }
  fs::path dir_;
};

// A tiny tokenizer.json: vocab a, b, ab; one merge.
std::string tiny_json(const std::string& model_type, const std::string& merges) {
  return R"({"model": {"type": ")" + model_type + R"(", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": )" + merges +
         R"(}, "pre_tokenizer": null, "decoder": null})";
}

TEST_F(TokenizerInputs, TinyTokenizerJsonMerges) {
  const auto t = load_tokenizer(file("tokenizer.json", tiny_json("BPE", R"(["a b"])")));
  EXPECT_EQ(t->encode("abab"), (std::vector<TokenId>{2, 2}));
  EXPECT_EQ(t->encode("ba"), (std::vector<TokenId>{1, 0}));
  EXPECT_EQ(t->vocab_size(), 3);
}

TEST_F(TokenizerInputs, UnsupportedModelTypeNamesFileAndType) {
  const std::string path = file("tokenizer.json", tiny_json("Unigram", "[]"));
  const std::string message = error_message_of([&] { load_tokenizer(path); });
  EXPECT_NE(message.find(path + ": model type 'Unigram' is not supported"), std::string::npos) << message;
}

TEST_F(TokenizerInputs, MergeOfUnknownTokenNamesFileAndMerge) {
  const std::string path = file("tokenizer.json", tiny_json("BPE", R"(["a b", "b c"])"));
  const std::string message = error_message_of([&] { load_tokenizer(path); });
  EXPECT_NE(message.find(path + ": merge 2 ('b c') names the token 'c', which is not in the vocabulary"),
            std::string::npos)
      << message;
}

TEST_F(TokenizerInputs, MergesTxtWithUnknownTokenNamesLine) {
  file("vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  const std::string merges = file("merges.txt", "#version: 0.2\na b\nab x\n");
  const std::string message = error_message_of([&] { load_tokenizer(dir_.string()); });
  EXPECT_NE(message.find(merges + ": line 3: 'x' is not in the vocabulary"), std::string::npos) << message;
  file("merges.txt", "#version: 0.2\na b c\n");
  EXPECT_NE(error_message_of([&] { load_tokenizer(dir_.string()); }).find("line 2: 'a b c' is not two tokens"),
            std::string::npos);
}

TEST_F(TokenizerInputs, NotJsonAndUnknownComponentsNameTheFile) {
  const std::string broken = file("tokenizer.json", "{\"model\": ");
  EXPECT_NE(error_message_of([&] { load_tokenizer(broken); }).find(broken + ": not valid JSON"), std::string::npos);
  std::string json = tiny_json("BPE", "[]");
  json.replace(json.find("\"pre_tokenizer\": null"), 21, R"("pre_tokenizer": {"type": "BertPreTokenizer"})");
  const std::string unknown = file("tokenizer.json", json);
  EXPECT_NE(error_message_of([&] {
              load_tokenizer(unknown);
            }).find(unknown + ": pre_tokenizer type 'BertPreTokenizer' is not supported"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] { load_tokenizer((dir_ / "nothing_here").string()); }).find("no such file"),
            std::string::npos);
  fs::create_directories(dir_ / "empty");
  EXPECT_NE(error_message_of([&] { load_tokenizer((dir_ / "empty").string()); }).find("holds no tokenizer"),
            std::string::npos);
}

TEST_F(TokenizerInputs, VocabLargerThanEmbedding) {
  const auto t = load_tokenizer(kFixtures + "/llama3");
  const std::string message = error_message_of([&] { check_vocab_fits(*t, 1000, "mt_train --init-from m"); });
  EXPECT_NE(message.find("mt_train --init-from m: the tokenizer has 1208 ids but the model's embedding has 1000 rows"),
            std::string::npos)
      << message;
  EXPECT_NO_THROW(check_vocab_fits(*t, 1208, "x"));
}

TEST_F(TokenizerInputs, DecodeOfUnknownIdNamesIdAndPosition) {
  const auto t = load_tokenizer(kFixtures + "/gpt2");
  EXPECT_NE(error_message_of([&] { t->decode({5, 99999}); }).find("id 99999 at position 1"), std::string::npos);
}

TEST_F(TokenizerInputs, SpecialTokensByNameAndFromTokenizerConfig) {
  const auto llama3 = load_tokenizer(kFixtures + "/llama3");
  EXPECT_EQ(llama3->special_tokens().bos, llama3->token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(llama3->special_tokens().eos, llama3->token_to_id("<|end_of_text|>"));
  fs::copy_file(kFixtures + "/llama3/tokenizer.json", dir_ / "tokenizer.json");
  file("tokenizer_config.json", R"({"eos_token": {"content": "<|eot_id|>"}, "pad_token": "<|end_of_text|>"})");
  const auto configured = load_tokenizer(dir_.string());
  EXPECT_EQ(configured->special_tokens().eos, configured->token_to_id("<|eot_id|>"));
  EXPECT_EQ(configured->special_tokens().pad, configured->token_to_id("<|end_of_text|>"));
  file("tokenizer_config.json", R"({"eos_token": "<nope>"})");
  EXPECT_NE(error_message_of([&] { load_tokenizer(dir_.string()); }).find("eos_token '<nope>' is not a token"),
            std::string::npos);
}

// Python's bytes.decode("utf-8", errors="replace"): one U+FFFD per maximal invalid subpart.
TEST(Utf8, ReplacementMatchesPython) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("a\x80"
                                 "b"),
            "a" + r + "b");
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"), r);                      // truncated: one subpart
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), r + r);                  // overlong lead: two
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), r + r + r);          // surrogate: three
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98!"), r + "!");           // truncated 4-byte: one
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82\xAC"), "\xE2\x82\xAC");     // valid: unchanged
}

TEST_F(TokenizerInputs, ParallelEncodingKeepsOrderAndEqualsSerial) {
  const auto t = load_tokenizer(kFixtures + "/gpt2");
  std::vector<std::string> docs;
  for (int i = 0; i < 500; ++i) docs.push_back("document " + std::to_string(i) + " with words, 123 and \xE4\xBD\xA0\n");
  const std::vector<std::string_view> views(docs.begin(), docs.end());
  const auto parallel = encode_documents(*t, views, false, 4);
  ASSERT_EQ(parallel.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(parallel[i], t->encode(docs[i])) << i;
  EXPECT_THROW(parallel_for(100, 3, [](size_t i) { MT_CHECK(i != 57, "document 57 failed"); }), Error);
}

TEST_F(TokenizerInputs, JsonlFieldErrorsNameFileAndLine) {
  const std::string path = file("corpus.jsonl", "{\"text\": \"one\"}\n\n{\"body\": \"two\"}\n");
  std::vector<std::string> docs;
  const std::string message = error_message_of([&] {
    split_documents({path, true, 0}, read_whole_file(path), "text", docs);
  });
  EXPECT_NE(message.find(path + ": line 3: no \"text\" field"), std::string::npos) << message;
  EXPECT_NE(error_message_of([&] {
              jsonl_string_field("[1]", "text", "f.jsonl", 7);
            }).find("f.jsonl: line 7: not a JSON object"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] {
              jsonl_string_field("{\"text\": 3}", "text", "f.jsonl", 2);
            }).find("line 2: \"text\" is not a string"),
            std::string::npos);
}

TEST_F(TokenizerInputs, PromptCompletionMasksThePrompt) {
  const auto t = load_tokenizer(kFixtures + "/llama3");
  const auto e = encode_prompt_completion(*t, R"({"prompt": "Question: why?", "completion": " Because."})", "f", 1);
  const auto prompt = t->encode("Question: why?"), completion = t->encode(" Because.");
  ASSERT_EQ(e.ids.size(), 1 + prompt.size() + completion.size() + 1);
  EXPECT_EQ(e.ids.front(), *t->special_tokens().bos);
  EXPECT_EQ(e.ids.back(), *t->special_tokens().eos);
  for (size_t i = 0; i < e.ids.size(); ++i) EXPECT_EQ(e.loss_mask[i], i > prompt.size() ? 1 : 0) << i;
  EXPECT_NE(error_message_of([&] {
              encode_prompt_completion(*t, R"({"prompt": "x"})", "sft.jsonl", 4);
            }).find("sft.jsonl: line 4: no \"completion\" field"),
            std::string::npos);
}

TEST_F(TokenizerInputs, MessagesTrainOnlyAssistantTurns) {
  const auto t = load_tokenizer(kFixtures + "/gpt2");
  const auto roles = RoleTemplate::parse({"user=U: {content}\\n", "assistant=A: {content}\\n"});
  const auto e =
      encode_messages(*t, roles,
                      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                    {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"}]})",
                      "chat.jsonl", 1);
  std::vector<uint8_t> want;
  const auto add = [&](const std::string& text, uint8_t m) { want.insert(want.end(), t->encode(text).size(), m); };
  want.push_back(0);  // bos: <|endoftext|>
  add("U: hi\n", 0);
  add("A: yo\n", 1);
  add("U: more\n", 0);
  add("A: ok\n", 1);
  want.push_back(1);  // eos
  EXPECT_EQ(e.loss_mask, want);
  EXPECT_NE(error_message_of([&] {
              encode_messages(*t, roles, R"({"messages": [{"role": "tool", "content": "x"}]})", "chat.jsonl", 9);
            }).find("chat.jsonl: line 9: role 'tool' has no template"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] { RoleTemplate::parse({"user=no placeholder"}); }).find("has no {content}"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::tok
