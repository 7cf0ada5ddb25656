// Hugging Face tokenizers with a BPE model: read from tokenizer.json (GPT-2, Llama 3, Qwen2,
// SmolLM, and the tokenizer.json form of Llama 2 / Mistral's SentencePiece models), or from
// GPT-2's vocab.json + merges.txt. encode runs the same pipeline Hugging Face's does:
//
//   added tokens (raw) -> normalizer -> added tokens (normalized) -> pre-tokenizer -> BPE
//   -> post-processor (only with add_special_tokens)
#pragma once

#include <memory>
#include <string>

#include "tokenizers/added_tokens.h"
#include "tokenizers/bpe.h"
#include "tokenizers/hf_components.h"

namespace mt::tok {

class HfTokenizer : public Tokenizer {
 public:
  // Throws FileError naming the file and what is wrong: unreadable, not JSON (with line and
  // column), a model type other than BPE, a merge naming a token not in the vocabulary, a
  // component type this library does not support.
  static std::unique_ptr<HfTokenizer> from_json_file(const std::string& path);
  // GPT-2's files; "<|endoftext|>", where the vocabulary has it, is a special added token.
  static std::unique_ptr<HfTokenizer> from_gpt2_files(const std::string& vocab_path, const std::string& merges_path);

  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const override;
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  std::string id_to_token(TokenId id) const override;
  std::vector<AddedToken> added_tokens() const override;
  std::string description() const override { return description_; }

 private:
  HfTokenizer() = default;
  void finish(std::vector<AddedTokenSpec> added, std::string description, const std::string& where);
  void encode_segment(std::string_view segment, bool at_start, std::vector<TokenId>& ids) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::vector<AddedTokenSpec> added_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_, normalized_matcher_;
  int64_t vocab_size_ = 0;
  std::string description_;
};

}  // namespace mt::tok
