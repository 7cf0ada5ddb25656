#include "tokenizers/regex.h"

#include "core/error.h"
#include "tokenizers/utf8.h"

#ifdef MT_WITH_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace mt::tok {

#ifdef MT_WITH_PCRE2

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

bool have_regex_engine() { return true; }

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // The text is valid UTF-8 by the time it is matched (tokenizers/utf8.h), so PCRE2's own
  // check of every subject is skipped at match time.
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  compiled_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    MT_CHECK(false, "regex: cannot compile pattern '", pattern, "' at offset ", offset, ": ",
             reinterpret_cast<const char*>(message));
  }
  // Without JIT support (some platforms) pcre2_match interprets the pattern: slower, same matches.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;

void Regex::for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const {
  struct MatchData {
    pcre2_match_data* data;
    explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
    ~MatchData() { pcre2_match_data_free(data); }
  };
  MatchData match(compiled_->code);
  MT_CHECK(match.data != nullptr, "regex: out of memory for match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    MT_CHECK(rc >= 0, "regex: matching '", pattern_, "' failed with PCRE2 error ", rc);
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      on_match(begin, end);
      start = end;
    } else {
      if (begin >= text.size()) return;
      const int n = utf8_sequence_length(text, begin);
      start = begin + (n > 0 ? n : 1);
    }
  }
}

#else  // no PCRE2

struct Regex::Compiled {};

bool have_regex_engine() { return false; }

Regex::Regex(const std::string& pattern, bool) : pattern_(pattern) {
  MT_CHECK_T(NotImplementedError, false, "regex: this build of mixtrain has no PCRE2, so pre-tokenizer patterns ('",
             pattern, "') cannot be used; install libpcre2-dev (tools/setup.sh) and reconfigure");
}

Regex::~Regex() = default;

void Regex::for_each_match(std::string_view, const std::function<void(size_t, size_t)>&) const {}

#endif

}  // namespace mt::tok
