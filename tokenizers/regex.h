// Regular expressions for pre-tokenizers, through PCRE2 (UTF and Unicode properties on, JIT
// compiled where the platform has it). Hugging Face's tokenizers use Oniguruma; the patterns
// of the model families (GPT-2, Llama 3, Qwen2) use only constructs both engines read the same
// way: \p{L}, \p{N}, \s, (?i:...), lookahead and bounded repeats.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace mt::tok {

class Regex {
 public:
  // `literal`: the pattern is a plain string to find, not a regular expression.
  // Throws mt::Error quoting the pattern and PCRE2's message when it does not compile.
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for each non-empty match in `text`, left to right, without
  // overlaps (after an empty match the search moves on by one character).
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

// True if this build has PCRE2 (and so the Hugging Face and GPT-2 BPE tokenizers).
bool have_regex_engine();

}  // namespace mt::tok
