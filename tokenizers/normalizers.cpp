// Normalizers of tokenizer.json (see hf_components.h).
#include <cstdlib>

#include "tokenizers/hf_components.h"
#include "tokenizers/hf_json.h"
#include "tokenizers/utf8.h"

#ifdef MT_WITH_UTF8PROC
#include <utf8proc.h>
#endif

namespace mt::tok {
namespace {

// Replaces every match of `pattern` (a string or a regex) with `content`.
std::string replace_all(const std::string& text, const Regex& pattern, const std::string& content) {
  std::string out;
  size_t previous = 0;
  pattern.for_each_match(text, [&](size_t begin, size_t end) {
    out.append(text, previous, begin - previous);
    out += content;
    previous = end;
  });
  out.append(text, previous, std::string::npos);
  return out;
}

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string text) const override { return replace_all(text, *pattern_, content_); }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    size_t begin = 0, end = text.size();
    // Unicode whitespace, one character at a time, from each end asked for.
    const auto char_at = [&](size_t i, int& n) {
      n = utf8_sequence_length(text, i);
      return n > 0 ? decode_code_point(text, i, n) : char32_t{0xFFFD};
    };
    while (left_ && begin < end) {
      int n;
      if (!is_unicode_whitespace(char_at(begin, n)) || n == 0) break;
      begin += n;
    }
    while (right_ && end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      int n;
      if (!is_unicode_whitespace(char_at(start, n))) break;
      end = start;
    }
    return text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

#ifdef MT_WITH_UTF8PROC
// Unicode normalization forms through utf8proc (Debian's libutf8proc-dev).
class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(utf8proc_option_t options, std::string name) : options_(options), name_(std::move(name)) {}
  std::string normalize(std::string text) const override {
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                static_cast<utf8proc_ssize_t>(text.size()), &out, options_);
    MT_CHECK(n >= 0, "tokenizer: ", name_, " normalization failed: ", utf8proc_errmsg(n));
    std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

 private:
  utf8proc_option_t options_;
  std::string name_;
};
#endif

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

std::unique_ptr<Normalizer> parse_unicode_form(const std::string& type, const std::string& where) {
#ifdef MT_WITH_UTF8PROC
  const auto base = static_cast<utf8proc_option_t>(UTF8PROC_STABLE);
  if (type == "NFC")
    return std::make_unique<UnicodeNormalizer>(static_cast<utf8proc_option_t>(base | UTF8PROC_COMPOSE), type);
  if (type == "NFD") {
    return std::make_unique<UnicodeNormalizer>(static_cast<utf8proc_option_t>(base | UTF8PROC_DECOMPOSE), type);
  }
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(base | UTF8PROC_COMPOSE | UTF8PROC_COMPAT), type);
  }
  return std::make_unique<UnicodeNormalizer>(
      static_cast<utf8proc_option_t>(base | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), type);
#else
  detail::fail_file(where, "the ", type,
                    " normalizer needs utf8proc, which this build of mixtrain lacks; install libutf8proc-dev "
                    "(tools/setup.sh) and reconfigure");
#endif
}

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const char* in = "normalizer";
  const std::string type = type_of(spec, where, in);
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(parse_pattern(spec, where, in),
                                               required<std::string>(spec, "content", where, in));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(required<std::string>(spec, "prepend", where, in));
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(field_or<bool>(spec, "strip_left", true, where, in),
                                             field_or<bool>(spec, "strip_right", true, where, in));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") return parse_unicode_form(type, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : required_field(spec, "normalizers", where, in)) {
      if (auto parsed = parse_normalizer(step, where)) steps.push_back(std::move(parsed));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  detail::fail_file(where, "normalizer type '", type,
                    "' is not supported (supported: Replace, Prepend, Strip, NFC, NFD, NFKC, NFKD, Sequence)");
}

}  // namespace mt::tok
