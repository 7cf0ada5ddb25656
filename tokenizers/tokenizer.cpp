#include "tokenizers/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizers/hf_tokenizer.h"
#include "tokenizers/sentencepiece_tokenizer.h"

namespace mt::tok {
namespace fs = std::filesystem;
namespace {

// One id per byte (core/data/byte_tokenizer.h's scheme): lossless, vocabulary 256.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<TokenId> encode(std::string_view text, bool) const override {
    return std::vector<TokenId>(reinterpret_cast<const unsigned char*>(text.data()),
                                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  std::string decode(const std::vector<TokenId>& ids, bool) const override {
    std::string text;
    text.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      MT_CHECK(ids[i] < 256, "tokenizer decode: id ", ids[i], " at position ", i, " is not a byte (vocabulary 256)");
      text.push_back(static_cast<char>(ids[i]));
    }
    return text;
  }
  int64_t vocab_size() const override { return 256; }
  std::optional<TokenId> token_to_id(std::string_view token) const override {
    if (token.size() != 1) return std::nullopt;
    return static_cast<unsigned char>(token[0]);
  }
  std::string id_to_token(TokenId id) const override { return id < 256 ? std::string(1, static_cast<char>(id)) : ""; }
  std::string description() const override { return "bytes (256 ids)"; }
};

// tokenizer_config.json's "bos_token": "<s>" or {"content": "<s>", ...}; null or absent: none.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

std::optional<TokenId> first_known(const Tokenizer& t, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto id = t.token_to_id(name)) return id;
  }
  return std::nullopt;
}

// The bos / eos / pad / unk tokens: from tokenizer_config.json in `dir` where it names them,
// else by the names the model families use.
void find_special_tokens(Tokenizer& t, const fs::path& dir) {
  SpecialTokens s = t.special_tokens();
  if (!s.bos) s.bos = first_known(t, {"<|begin_of_text|>", "<s>", "<|endoftext|>"});
  if (!s.eos) s.eos = first_known(t, {"<|end_of_text|>", "</s>", "<|endoftext|>", "<|im_end|>"});
  if (!s.pad) s.pad = first_known(t, {"<pad>", "<|pad|>", "<|finetune_right_pad_id|>"});
  if (!s.unk) s.unk = first_known(t, {"<unk>"});
  const fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    nlohmann::json config;
    try {
      std::ifstream in(config_path);
      config = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      detail::fail_file(config_path.string(), "not valid JSON: ", e.what());
    }
    const auto apply = [&](const char* key, std::optional<TokenId>& slot) {
      const auto name = config_token(config, key);
      if (!name) return;
      const auto id = t.token_to_id(*name);
      if (!id) detail::fail_file(config_path.string(), key, " '", *name, "' is not a token of the tokenizer");
      slot = id;
    };
    apply("bos_token", s.bos);
    apply("eos_token", s.eos);
    apply("pad_token", s.pad);
    apply("unk_token", s.unk);
  }
  t.set_special_tokens(s);
}

std::unique_ptr<Tokenizer> load_file(const fs::path& file) {
  const std::string name = file.filename().string();
  if (name == "vocab.json" || name == "merges.txt") {
    const fs::path dir = file.parent_path();
    return HfTokenizer::from_gpt2_files((dir / "vocab.json").string(), (dir / "merges.txt").string());
  }
  if (file.extension() == ".model") return load_sentencepiece(file.string());
  if (file.extension() == ".json") return HfTokenizer::from_json_file(file.string());
  detail::fail_file(file.string(),
                    "not a tokenizer file (expected tokenizer.json, vocab.json / merges.txt or a "
                    "SentencePiece .model)");
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty() || path == "bytes") return std::make_unique<ByteTokenizer>();
  const fs::path p(path);
  if (!fs::exists(p)) detail::fail_file(path, "no such file or directory");
  fs::path file = p;
  if (fs::is_directory(p)) {
    if (fs::exists(p / "tokenizer.json")) {
      file = p / "tokenizer.json";
    } else if (fs::exists(p / "vocab.json") && fs::exists(p / "merges.txt")) {
      file = p / "vocab.json";
    } else if (fs::exists(p / "tokenizer.model")) {
      file = p / "tokenizer.model";
    } else {
      detail::fail_file(path, "holds no tokenizer (tokenizer.json, vocab.json + merges.txt, or tokenizer.model)");
    }
  }
  auto tokenizer = load_file(file);
  find_special_tokens(*tokenizer, file.parent_path());
  return tokenizer;
}

void check_vocab_fits(const Tokenizer& tokenizer, int64_t embedding_rows, const std::string& what) {
  MT_CHECK(tokenizer.vocab_size() <= embedding_rows, what, ": the tokenizer has ", tokenizer.vocab_size(),
           " ids but the model's embedding has ", embedding_rows, " rows (", tokenizer.description(), ")");
}

}  // namespace mt::tok
