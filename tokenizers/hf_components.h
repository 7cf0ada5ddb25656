// The parts of a Hugging Face tokenizer.json around its model, each read from its JSON object:
//
//   normalizer      text -> text, per segment between added tokens (Prepend, Replace, NFC, ...)
//   pre_tokenizer   segment -> pieces the model tokenizes one by one (ByteLevel, Split, Metaspace)
//   decoder         tokens -> text (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace)
//   post_processor  the special tokens encode(..., add_special_tokens) adds (TemplateProcessing)
//
// A type this file does not know is a FileError naming the file and the type, never ignored.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizers/pieces.h"
#include "tokenizers/tokenizer.h"

namespace mt::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(std::vector<Piece>& pieces) const = 0;
  // True if the pieces come out in GPT-2's byte-to-character alphabet (tokenizers/byte_level.h).
  virtual bool byte_level() const { return false; }
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode(std::vector<std::string>& tokens) const = 0;  // in place, as a chain
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void add_special_tokens(std::vector<TokenId>& ids) const = 0;
  virtual std::vector<TokenId> added_ids() const = 0;  // every id it may add, to check against the vocabulary
};

// Each returns nullptr for a JSON null. `where` names the file in errors.
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& spec, const std::string& where);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& spec, const std::string& where);
std::unique_ptr<Decoder> parse_decoder(const nlohmann::json& spec, const std::string& where);
std::unique_ptr<PostProcessor> parse_post_processor(const nlohmann::json& spec, const std::string& where);

// The pre-tokenizer GPT-2's vocab.json + merges.txt files imply: ByteLevel with its split pattern.
std::unique_ptr<PreTokenizer> gpt2_pre_tokenizer();
std::unique_ptr<Decoder> byte_level_decoder();

}  // namespace mt::tok
