#include "tokenizers/pieces.h"

#include "core/error.h"

namespace mt::tok {
namespace {

struct Span {
  size_t begin, end;
  bool matched;
};

// The whole of `text` as alternating unmatched and matched spans, none empty.
std::vector<Span> find_spans(std::string_view text, const Regex& pattern) {
  std::vector<Span> spans;
  size_t previous = 0;
  pattern.for_each_match(text, [&](size_t begin, size_t end) {
    if (begin != previous) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
  });
  if (previous != text.size()) spans.push_back({previous, text.size(), false});
  return spans;
}

// The spans to keep, each marked `matched` if it is to be removed (only for `removed`).
std::vector<Span> apply_behavior(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::removed:
      return spans;
    case SplitBehavior::isolated:
      for (auto& s : spans) s.matched = false;
      return spans;
    case SplitBehavior::contiguous:
      for (const auto& s : spans) {
        if (s.matched == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.matched;
      }
      return out;
    case SplitBehavior::merged_with_previous:
      for (const auto& s : spans) {
        if (s.matched && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.matched;
      }
      return out;
    case SplitBehavior::merged_with_next:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->matched && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back({it->begin, it->end, false});
        }
        previous_match = it->matched;
      }
      return {out.rbegin(), out.rend()};
  }
  return out;
}

}  // namespace

SplitBehavior parse_split_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  detail::fail_file(where, "unknown split behavior '", name, "'");
}

void split_pieces(std::vector<Piece>& pieces, const Regex& pattern, SplitBehavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  for (auto& piece : pieces) {
    auto spans = find_spans(piece.text, pattern);
    if (invert) {
      for (auto& s : spans) s.matched = !s.matched;
    }
    for (const auto& s : apply_behavior(std::move(spans), behavior)) {
      if (s.matched || s.end == s.begin) continue;
      out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
    }
  }
  pieces.swap(out);
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace mt::tok
