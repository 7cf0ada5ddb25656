// Decoders and post-processors of tokenizer.json (see hf_components.h). Decoders run as a chain
// over the tokens' strings; the strings left at the end are concatenated.
#include "tokenizers/byte_level.h"
#include "tokenizers/hf_components.h"
#include "tokenizers/hf_json.h"
#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

// Characters back to bytes; a token with a character outside the byte map keeps its own UTF-8.
// The bytes are read as UTF-8 with U+FFFD for invalid parts, so the result is always valid.
class ByteLevelDecoder : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& token : tokens) {
      const size_t mark = bytes.size();
      for (size_t i = 0; i < token.size();) {
        const int n = std::max(1, utf8_sequence_length(token, i));
        const auto b = char_to_byte(decode_code_point(token, i, n));
        if (!b) {
          bytes.resize(mark);
          bytes += token;
          break;
        }
        bytes.push_back(static_cast<char>(*b));
        i += n;
      }
    }
    tokens.assign(1, replace_invalid_utf8(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (size_t t = 0; t < tokens.size(); ++t) {
      const std::string with = t == 0 && strip_first_ ? "" : " ";
      std::string out;
      for (size_t pos = 0;;) {
        const size_t hit = tokens[t].find(replacement_, pos);
        out.append(tokens[t], pos, hit == std::string::npos ? std::string::npos : hit - pos);
        if (hit == std::string::npos) break;
        out += with;
        pos = hit + replacement_.size();
      }
      tokens[t].swap(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      std::string out;
      size_t previous = 0;
      pattern_->for_each_match(token, [&](size_t begin, size_t end) {
        out.append(token, previous, begin - previous);
        out += content_;
        previous = end;
      });
      out.append(token, previous, std::string::npos);
      token.swap(out);
    }
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// Runs of "<0xXX>" tokens become their bytes when those are valid UTF-8, else one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_bytes = 0;
    const auto flush = [&] {
      if (run_bytes == 0) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_bytes; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_bytes = 0;
    };
    for (auto& token : tokens) {
      int byte = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') byte = hex_byte(token[3], token[4]);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_bytes;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int hex_byte(char high, char low) {
    const int h = hex_digit(high), l = hex_digit(low);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& token : tokens) all += token;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t k = 0; k < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++k) {
        begin += content_.size();
      }
      for (size_t k = 0; k < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class TemplateProcessor : public PostProcessor {
 public:
  TemplateProcessor(std::vector<TokenId> before, std::vector<TokenId> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void add_special_tokens(std::vector<TokenId>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }
  std::vector<TokenId> added_ids() const override {
    std::vector<TokenId> all = before_;
    all.insert(all.end(), after_.begin(), after_.end());
    return all;
  }

 private:
  std::vector<TokenId> before_, after_;
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void add_special_tokens(std::vector<TokenId>& ids) const override {
    for (const auto& step : steps_) step->add_special_tokens(ids);
  }
  std::vector<TokenId> added_ids() const override {
    std::vector<TokenId> all;
    for (const auto& step : steps_) {
      const auto ids = step->added_ids();
      all.insert(all.end(), ids.begin(), ids.end());
    }
    return all;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// TemplateProcessing's "single" template: special tokens around the sequence "$A".
std::unique_ptr<PostProcessor> parse_template(const json& spec, const std::string& where) {
  const char* in = "post_processor";
  std::vector<TokenId> before, after;
  bool seen_sequence = false;
  const json& specials = required_field(spec, "special_tokens", where, in);
  for (const auto& item : required_field(spec, "single", where, in)) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const auto name = required<std::string>(required_field(item, "SpecialToken", where, in), "id", where, in);
    const auto it = specials.find(name);
    if (it == specials.end())
      detail::fail_file(where, "post_processor names special token '", name, "' it does not define");
    const json& ids = required_field(*it, "ids", where, in);
    if (!ids.is_array()) detail::fail_file(where, "post_processor special token '", name, "' has no ids array");
    for (const auto& id : ids) (seen_sequence ? after : before).push_back(value_as<TokenId>(id, "ids", where, in));
  }
  return std::make_unique<TemplateProcessor>(std::move(before), std::move(after));
}

// BertProcessing and RobertaProcessing: [cls] sequence [sep], each given as [token, id].
std::unique_ptr<PostProcessor> parse_cls_sep(const json& spec, const std::string& where) {
  const char* in = "post_processor";
  const auto id_of = [&](const char* key) {
    const json& pair = required_field(spec, key, where, in);
    if (!pair.is_array() || pair.size() != 2) detail::fail_file(where, "post_processor.", key, " is not [token, id]");
    return value_as<TokenId>(pair[1], key, where, in);
  };
  return std::make_unique<TemplateProcessor>(std::vector<TokenId>{id_of("cls")}, std::vector<TokenId>{id_of("sep")});
}

}  // namespace

std::unique_ptr<Decoder> parse_decoder(const json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const char* in = "decoder";
  const std::string type = type_of(spec, where, in);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    const auto scheme = field_or<std::string>(spec, "prepend_scheme", "", where, in);
    const bool strip_first =
        scheme.empty() ? field_or<bool>(spec, "add_prefix_space", true, where, in) : scheme != "never";
    return std::make_unique<MetaspaceDecoder>(field_or<std::string>(spec, "replacement", "\xE2\x96\x81", where, in),
                                              strip_first);
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(parse_pattern(spec, where, in),
                                            required<std::string>(spec, "content", where, in));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(required<std::string>(spec, "content", where, in),
                                          field_or<size_t>(spec, "start", 0, where, in),
                                          field_or<size_t>(spec, "stop", 0, where, in));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step : required_field(spec, "decoders", where, in)) {
      if (auto parsed = parse_decoder(step, where)) steps.push_back(std::move(parsed));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  detail::fail_file(
      where, "decoder type '", type,
      "' is not supported (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");
}

std::unique_ptr<PostProcessor> parse_post_processor(const json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec, where, "post_processor");
  if (type == "ByteLevel") return nullptr;  // changes offsets only, never ids
  if (type == "TemplateProcessing") return parse_template(spec, where);
  if (type == "BertProcessing" || type == "RobertaProcessing") return parse_cls_sep(spec, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& step : required_field(spec, "processors", where, "post_processor")) {
      if (auto parsed = parse_post_processor(step, where)) steps.push_back(std::move(parsed));
    }
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  detail::fail_file(where, "post_processor type '", type,
                    "' is not supported (supported: ByteLevel, TemplateProcessing, BertProcessing, RobertaProcessing, "
                    "Sequence)");
}

std::unique_ptr<Decoder> byte_level_decoder() { return std::make_unique<ByteLevelDecoder>(); }

}  // namespace mt::tok
