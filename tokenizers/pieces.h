// The pieces a pre-tokenizer cuts text into, and how a split keeps or merges what matched
// (Hugging Face's SplitDelimiterBehavior).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizers/regex.h"

namespace mt::tok {

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the whole input (Metaspace's prepend_scheme "first")
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// Parses "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous".
SplitBehavior parse_split_behavior(const std::string& name, const std::string& where);

// Splits each piece at the matches of `pattern` (or between them, with `invert`).
void split_pieces(std::vector<Piece>& pieces, const Regex& pattern, SplitBehavior behavior, bool invert);

// Unicode White_Space (Rust's char::is_whitespace, which Hugging Face's tokenizers use).
bool is_unicode_whitespace(char32_t c);

}  // namespace mt::tok
