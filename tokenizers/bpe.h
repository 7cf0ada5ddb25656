// The BPE model of Hugging Face's tokenizers: a vocabulary, ranked merges, and how a word is
// split into the vocabulary's tokens.
//
// A word (one pre-tokenizer piece) starts as one symbol per character; a character missing from
// the vocabulary becomes its bytes' "<0xXX>" tokens (byte_fallback), else the unknown token
// (consecutive ones fused into one with fuse_unk), else it is dropped, as Hugging Face does.
// Then the adjacent pair of lowest merge rank is merged, leftmost first among equal ranks, until
// no pair has a merge: a heap of candidate merges, so a word of n symbols costs O(n log n) and
// arbitrary input cannot make it quadratic. With ignore_merges, a word that is itself in the
// vocabulary is that one token (Llama 3).
//
// Results of words up to kCachedWordBytes long are kept in a per-thread cache: text repeats its
// words, so most words are a hash lookup.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace mt::tok {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `vocab` maps token to id; `merges` are (left, right) token pairs, best first. `where` names
  // the file for errors: a merge naming a token not in the vocabulary, a merged token missing.
  BpeModel(std::unordered_map<std::string, TokenId> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options,
           const std::string& where);

  // Appends the ids of `word` to `out`.
  void tokenize(std::string_view word, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  const std::string& id_to_token(TokenId id) const;                           // "" for an id the vocabulary lacks
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }  // largest id + 1
  const std::unordered_map<std::string, TokenId>& vocab() const { return vocab_; }

  static constexpr size_t kCachedWordBytes = 256;

 private:
  struct Merge {
    uint32_t rank;
    TokenId merged;
  };
  static uint64_t pair_key(TokenId left, TokenId right) { return (uint64_t{left} << 32) | right; }
  void initial_symbols(std::string_view word, std::vector<TokenId>& ids, std::vector<uint32_t>& bytes) const;
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;
  void tokenize_uncached(std::string_view word, std::vector<TokenId>& out) const;

  std::unordered_map<std::string, TokenId> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::unordered_map<char32_t, TokenId> char_ids_;  // tokens that are one character
  std::optional<TokenId> byte_ids_[256];            // "<0xXX>" tokens, for byte_fallback
  std::optional<TokenId> unk_id_;
  BpeOptions options_;
  uint64_t cache_owner_;  // tells the per-thread caches of different models apart
};

}  // namespace mt::tok
