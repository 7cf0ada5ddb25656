// One interface for every tokenizer: text to token ids and back, the vocabulary size and the
// special tokens. load_tokenizer picks the implementation from the files it is given:
//
//   a directory with tokenizer.json        Hugging Face tokenizer (byte-level or Metaspace BPE)
//   a directory with vocab.json and merges.txt   GPT-2's BPE files
//   a directory with tokenizer.model       SentencePiece model (Llama 2, Mistral)
//   one of those files itself, or "bytes"  ... or the byte tokenizer (one id per byte)
//
// A directory with tokenizer.json and tokenizer.model uses tokenizer.json, as Hugging Face's
// fast tokenizers do. tokenizer_config.json beside the files, when present, names the bos, eos
// and pad tokens; without it they are found by their usual names (see special_tokens.cpp).
//
// Invalid UTF-8 input becomes U+FFFD per maximal invalid subpart before encoding (tokenizers/
// utf8.h), except in the byte tokenizer, which is lossless.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt::tok {

using TokenId = uint32_t;

struct SpecialTokens {
  std::optional<TokenId> bos, eos, pad, unk;
};

// A token that is matched in the text before the model sees it (Hugging Face's added tokens).
struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false;  // skipped by decode(..., skip_special_tokens = true)
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`; with add_special_tokens, the tokens the model's post-processor adds
  // (a leading bos for Llama, nothing for GPT-2). Thread-safe.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const = 0;
  // The text of `ids`; ids outside the vocabulary throw mt::Error naming the id and position.
  virtual std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false) const = 0;

  // One more than the largest id; the model's embedding must have at least this many rows.
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(TokenId id) const = 0;  // "" if the id has no token

  const SpecialTokens& special_tokens() const { return special_; }
  void set_special_tokens(const SpecialTokens& s) { special_ = s; }
  virtual std::vector<AddedToken> added_tokens() const { return {}; }
  // What was loaded, for logs: "byte-level BPE (tokenizer.json, 50257 ids)".
  virtual std::string description() const = 0;

 protected:
  SpecialTokens special_;
};

// Loads the tokenizer in `path` (see above); "bytes" (or "") gives the byte tokenizer.
// Throws FileError naming the file and what is wrong with it.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// Throws mt::Error unless the ids of `tokenizer` fit an embedding of `embedding_rows` rows:
// "<what>: the tokenizer has 128256 ids but the model's embedding has 32000 rows".
void check_vocab_fits(const Tokenizer& tokenizer, int64_t embedding_rows, const std::string& what);

}  // namespace mt::tok
