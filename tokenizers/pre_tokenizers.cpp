// Pre-tokenizers of tokenizer.json (see hf_components.h).
#include "tokenizers/byte_level.h"
#include "tokenizers/hf_components.h"
#include "tokenizers/hf_json.h"

namespace mt::tok {
namespace {

// GPT-2's: optionally a space in front, the split pattern, then bytes to characters. Each step
// applies to every piece it is given, as Hugging Face's does (inside a Sequence, after a Split).
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        pattern_(use_regex ? std::make_unique<Regex>(kGpt2SplitPattern) : nullptr) {}
  void split(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
      }
    }
    if (pattern_) split_pieces(pieces, *pattern_, SplitBehavior::isolated, false);
    std::string mapped;
    for (auto& p : pieces) {
      mapped.clear();
      append_byte_chars(mapped, p.text);
      p.text.swap(mapped);
    }
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> pattern_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<Piece>& pieces) const override { split_pieces(pieces, *pattern_, behavior_, invert_); }

 private:
  std::unique_ptr<Regex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

enum class PrependScheme { always, first, never };

// SentencePiece's convention in tokenizer.json: spaces become the replacement character ('▁'),
// one is put in front (always, or only at the start of the input: "first"), and with `split`
// the text is cut before each replacement character.
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        splitter_(split ? std::make_unique<Regex>(replacement_, /*literal=*/true) : nullptr) {}
  void split(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      std::string replaced;
      replaced.reserve(p.text.size() + 8);
      for (const char c : p.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool prepend = scheme_ == PrependScheme::always || (scheme_ == PrependScheme::first && p.at_start);
      if (prepend && replaced.compare(0, replacement_.size(), replacement_) != 0) replaced.insert(0, replacement_);
      p.text.swap(replaced);
    }
    if (splitter_) split_pieces(pieces, *splitter_, SplitBehavior::merged_with_next, false);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  std::unique_ptr<Regex> splitter_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->split(pieces);
  }
  bool byte_level() const override {
    for (const auto& step : steps_) {
      if (step->byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

PrependScheme parse_prepend_scheme(const json& spec, const std::string& where) {
  const auto scheme = field_or<std::string>(spec, "prepend_scheme", "", where, "pre_tokenizer");
  if (scheme.empty()) {  // files written before prepend_scheme existed
    return field_or<bool>(spec, "add_prefix_space", true, where, "pre_tokenizer") ? PrependScheme::always
                                                                                  : PrependScheme::never;
  }
  if (scheme == "always") return PrependScheme::always;
  if (scheme == "first") return PrependScheme::first;
  if (scheme == "never") return PrependScheme::never;
  detail::fail_file(where, "unknown Metaspace prepend_scheme '", scheme, "'");
}

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const char* in = "pre_tokenizer";
  const std::string type = type_of(spec, where, in);
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(field_or<bool>(spec, "add_prefix_space", true, where, in),
                                                   field_or<bool>(spec, "use_regex", true, where, in));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        parse_pattern(spec, where, in), parse_split_behavior(required<std::string>(spec, "behavior", where, in), where),
        field_or<bool>(spec, "invert", false, where, in));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(
        field_or<std::string>(spec, "replacement", "\xE2\x96\x81", where, in), parse_prepend_scheme(spec, where),
        field_or<bool>(spec, "split", true, where, in));
  }
  if (type == "Digits") {
    const bool individual = field_or<bool>(spec, "individual_digits", false, where, in);
    return std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(R"(\p{N})"),
                                               individual ? SplitBehavior::isolated : SplitBehavior::contiguous, false);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(R"(\s+)"), SplitBehavior::removed, false);
  }
  if (type == "Whitespace") {
    return std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(R"(\w+|[^\w\s]+)"), SplitBehavior::removed,
                                               true);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : required_field(spec, "pretokenizers", where, in)) {
      if (auto parsed = parse_pre_tokenizer(step, where)) steps.push_back(std::move(parsed));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  detail::fail_file(where, "pre_tokenizer type '", type,
                    "' is not supported (supported: ByteLevel, Split, Metaspace, Digits, Whitespace, WhitespaceSplit, "
                    "Sequence)");
}

std::unique_ptr<PreTokenizer> gpt2_pre_tokenizer() {
  return std::make_unique<ByteLevelPreTokenizer>(/*add_prefix_space=*/false, /*use_regex=*/true);
}

}  // namespace mt::tok
