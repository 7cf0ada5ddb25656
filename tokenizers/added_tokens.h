// Added tokens (Hugging Face's AddedVocabulary): strings matched in the text before the model
// sees it, each becoming its own id. The leftmost match wins and, among matches starting at the
// same place, the longest. lstrip / rstrip tokens also take the whitespace on their left / right.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace mt::tok {

struct AddedTokenSpec {
  AddedToken token;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;  // matched in the normalized text instead of the raw text
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<AddedTokenSpec> tokens);

  // Calls on_segment(text, id, offset) for the pieces of `text` in order: a match gives its id,
  // the text between matches gives std::nullopt. Empty text between matches is skipped.
  using SegmentFn = std::function<void(std::string_view, std::optional<TokenId>, size_t)>;
  void split(std::string_view text, const SegmentFn& on_segment) const;
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<AddedTokenSpec> tokens_;
  std::vector<std::vector<int>> by_first_byte_;  // [256]: indices into tokens_, longest first
};

}  // namespace mt::tok
