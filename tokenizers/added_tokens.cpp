#include "tokenizers/added_tokens.h"

#include <algorithm>

#include "tokenizers/pieces.h"
#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

// The length of the whitespace that ends text[floor, end), one character at a time.
size_t whitespace_before(std::string_view text, size_t floor, size_t end) {
  size_t begin = end;
  while (begin > floor) {
    size_t start = begin - 1;
    while (start > floor && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    const int n = utf8_sequence_length(text, start);
    if (n == 0 || !is_unicode_whitespace(decode_code_point(text, start, n))) break;
    begin = start;
  }
  return end - begin;
}

size_t whitespace_after(std::string_view text, size_t begin) {
  size_t end = begin;
  while (end < text.size()) {
    const int n = utf8_sequence_length(text, end);
    if (n == 0 || !is_unicode_whitespace(decode_code_point(text, end, n))) break;
    end += n;
  }
  return end - begin;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedTokenSpec> tokens)
    : tokens_(std::move(tokens)), by_first_byte_(256) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& content = tokens_[i].token.content;
    if (!content.empty()) by_first_byte_[static_cast<unsigned char>(content[0])].push_back(static_cast<int>(i));
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](int a, int b) { return tokens_[a].token.content.size() > tokens_[b].token.content.size(); });
  }
}

void AddedTokenMatcher::split(std::string_view text, const SegmentFn& on_segment) const {
  size_t emitted = 0;  // text before this has been passed on
  for (size_t i = 0; i < text.size();) {
    const AddedTokenSpec* found = nullptr;
    for (const int k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (text.compare(i, tokens_[k].token.content.size(), tokens_[k].token.content) == 0) {
        found = &tokens_[k];
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + found->token.content.size();
    if (found->lstrip) begin -= whitespace_before(text, emitted, begin);
    if (found->rstrip) end += whitespace_after(text, end);
    if (begin > emitted) on_segment(text.substr(emitted, begin - emitted), std::nullopt, emitted);
    on_segment(text.substr(begin, end - begin), found->token.id, begin);
    emitted = i = end;
  }
  if (emitted < text.size()) on_segment(text.substr(emitted), std::nullopt, emitted);
}

}  // namespace mt::tok
