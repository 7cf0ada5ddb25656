#include "tokenizers/hf_tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "tokenizers/hf_json.h"
#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::fail_file(path, "cannot open for reading");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) detail::fail_file(path, "read error");
  return text.str();
}

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers too large
    detail::fail_file(path, "not valid JSON: ", e.what());
  }
}

std::unordered_map<std::string, TokenId> parse_vocab(const json& vocab, const std::string& where, const char* in) {
  if (!vocab.is_object()) detail::fail_file(where, in, " is not an object of token: id");
  std::unordered_map<std::string, TokenId> out;
  out.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > 0xFFFFFFFEull) {
      detail::fail_file(where, in, ": the id of '", token, "' is not an integer in [0, 2^32 - 1)");
    }
    out.emplace(token, id.get<TokenId>());
  }
  return out;
}

// Merges as "left right" strings (older files) or [left, right] pairs (newer ones).
std::vector<std::pair<std::string, std::string>> parse_merges(const json& merges, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> out;
  if (merges.is_null()) return out;
  if (!merges.is_array()) detail::fail_file(where, "model.merges is not an array");
  out.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      const auto text = m.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        detail::fail_file(where, "model.merges[", i, "] '", text, "' is not two tokens separated by one space");
      }
      out.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      detail::fail_file(where, "model.merges[", i, "] is neither \"left right\" nor [left, right]");
    }
  }
  return out;
}

BpeOptions parse_bpe_options(const json& model, const std::string& where) {
  const char* in = "model";
  BpeOptions options;
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    options.unk_token = required<std::string>(model, "unk_token", where, in);
  }
  options.fuse_unk = field_or<bool>(model, "fuse_unk", false, where, in);
  options.byte_fallback = field_or<bool>(model, "byte_fallback", false, where, in);
  options.ignore_merges = field_or<bool>(model, "ignore_merges", false, where, in);
  const double dropout = field_or<double>(model, "dropout", 0.0, where, in);
  if (dropout > 0) detail::fail_file(where, "model.dropout is ", dropout, ": BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!field_or<std::string>(model, key, "", where, in).empty()) {
      detail::fail_file(where, "model.", key, " is set: subword prefixes and suffixes are not supported");
    }
  }
  return options;
}

std::vector<AddedTokenSpec> parse_added_tokens(const json& added, const std::string& where) {
  std::vector<AddedTokenSpec> out;
  if (added.is_null()) return out;
  const char* in = "added_tokens[]";
  for (const auto& t : added) {
    AddedTokenSpec spec;
    spec.token.content = required<std::string>(t, "content", where, in);
    spec.token.id = required<TokenId>(t, "id", where, in);
    spec.token.special = field_or<bool>(t, "special", false, where, in);
    spec.lstrip = field_or<bool>(t, "lstrip", false, where, in);
    spec.rstrip = field_or<bool>(t, "rstrip", false, where, in);
    spec.normalized = field_or<bool>(t, "normalized", !spec.token.special, where, in);
    if (field_or<bool>(t, "single_word", false, where, in)) {
      detail::fail_file(where, "added token '", spec.token.content, "' is single_word, which is not supported");
    }
    if (spec.token.content.empty()) detail::fail_file(where, "an added token (id ", spec.token.id, ") is empty");
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::from_json_file(const std::string& path) {
  const json root = parse_json_file(path);
  const json& model = required_field(root, "model", path, "the file");
  const std::string type = field_or<std::string>(model, "type", "BPE", path, "model");
  if (type != "BPE") {
    detail::fail_file(path, "model type '", type,
                      "' is not supported (supported: BPE; Unigram, WordPiece and "
                      "WordLevel models are not)");
  }
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  t->model_ = std::make_unique<BpeModel>(
      parse_vocab(required_field(model, "vocab", path, "model"), path, "model.vocab"),
      parse_merges(model.value("merges", json()), path), parse_bpe_options(model, path), path);
  t->normalizer_ = parse_normalizer(root.value("normalizer", json()), path);
  t->pre_tokenizer_ = parse_pre_tokenizer(root.value("pre_tokenizer", json()), path);
  t->decoder_ = parse_decoder(root.value("decoder", json()), path);
  t->post_processor_ = parse_post_processor(root.value("post_processor", json()), path);
  const bool byte_level = t->pre_tokenizer_ && t->pre_tokenizer_->byte_level();
  t->finish(parse_added_tokens(root.value("added_tokens", json()), path),
            std::string(byte_level ? "byte-level BPE" : "BPE") + " (" + path + ")", path);
  return t;
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_gpt2_files(const std::string& vocab_path,
                                                          const std::string& merges_path) {
  auto vocab = parse_vocab(parse_json_file(vocab_path), vocab_path, "the vocabulary");
  std::istringstream lines(read_file(merges_path));
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      detail::fail_file(merges_path, "line ", number, ": '", line, "' is not two tokens separated by one space");
    }
    std::string left = line.substr(0, space), right = line.substr(space + 1);
    for (const std::string& name : {left, right, left + right}) {
      if (vocab.count(name) == 0) {
        detail::fail_file(merges_path, "line ", number, ": '", name, "' is not in the vocabulary (", vocab_path, ")");
      }
    }
    merges.emplace_back(std::move(left), std::move(right));
  }
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  std::vector<AddedTokenSpec> added;
  const auto eot = vocab.find("<|endoftext|>");
  if (eot != vocab.end()) added.push_back({{"<|endoftext|>", eot->second, true}, false, false, false});
  t->model_ = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{}, merges_path);
  t->pre_tokenizer_ = gpt2_pre_tokenizer();
  t->decoder_ = byte_level_decoder();
  t->finish(std::move(added), "byte-level BPE (" + vocab_path + ", " + merges_path + ")", vocab_path);
  return t;
}

void HfTokenizer::finish(std::vector<AddedTokenSpec> added, std::string description, const std::string& where) {
  added_ = std::move(added);
  std::vector<AddedTokenSpec> raw, normalized;
  vocab_size_ = model_->size();
  for (const auto& spec : added_) {
    // Without a normalizer the two texts are the same; matching once keeps the order simple.
    (spec.normalized && normalizer_ ? normalized : raw).push_back(spec);
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{spec.token.id} + 1);
  }
  raw_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  normalized_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));
  description_ = std::move(description) + ", " + std::to_string(vocab_size_) + " ids";
  for (const TokenId id : post_processor_ ? post_processor_->added_ids() : std::vector<TokenId>{}) {
    if (id >= vocab_size_) {
      detail::fail_file(where, "post_processor adds id ", id, ", which is outside the vocabulary (", vocab_size_,
                        " ids)");
    }
  }
}

void HfTokenizer::encode_segment(std::string_view segment, bool at_start, std::vector<TokenId>& ids) const {
  std::vector<Piece> pieces{{std::string(segment), at_start}};
  if (pre_tokenizer_) pre_tokenizer_->split(pieces);
  for (const auto& piece : pieces) model_->tokenize(piece.text, ids);
}

std::vector<TokenId> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const std::string clean = replace_invalid_utf8(text);
  std::vector<TokenId> ids;
  ids.reserve(clean.size() / 3 + 4);
  raw_matcher_->split(clean, [&](std::string_view raw, std::optional<TokenId> id, size_t offset) {
    if (id) {
      ids.push_back(*id);
      return;
    }
    if (!normalizer_) {
      encode_segment(raw, offset == 0, ids);
      return;
    }
    const std::string normalized = normalizer_->normalize(std::string(raw));
    normalized_matcher_->split(normalized,
                               [&](std::string_view part, std::optional<TokenId> inner, size_t inner_offset) {
                                 if (inner) {
                                   ids.push_back(*inner);
                                 } else {
                                   encode_segment(part, offset == 0 && inner_offset == 0, ids);
                                 }
                               });
  });
  if (add_special_tokens && post_processor_) post_processor_->add_special_tokens(ids);
  return ids;
}

std::string HfTokenizer::decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
  std::unordered_map<TokenId, const AddedToken*> added;
  for (const auto& spec : added_) added[spec.token.id] = &spec.token;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto it = added.find(ids[i]);
    if (it != added.end()) {
      if (!(skip_special_tokens && it->second->special)) tokens.push_back(it->second->content);
      continue;
    }
    const std::string& token = model_->id_to_token(ids[i]);
    MT_CHECK(!token.empty(), "tokenizer decode: id ", ids[i], " at position ", i, " is not in the vocabulary (",
             vocab_size_, " ids)");
    tokens.push_back(token);
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  decoder_->decode(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::optional<TokenId> HfTokenizer::token_to_id(std::string_view token) const {
  for (const auto& spec : added_) {
    if (spec.token.content == token) return spec.token.id;
  }
  return model_->token_to_id(token);
}

std::string HfTokenizer::id_to_token(TokenId id) const {
  for (const auto& spec : added_) {
    if (spec.token.id == id) return spec.token.content;
  }
  return model_->id_to_token(id);
}

std::vector<AddedToken> HfTokenizer::added_tokens() const {
  std::vector<AddedToken> out;
  for (const auto& spec : added_) out.push_back(spec.token);
  return out;
}

}  // namespace mt::tok
