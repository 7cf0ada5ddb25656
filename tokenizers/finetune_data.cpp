#include "tokenizers/finetune_data.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizers/text_sources.h"

namespace mt::tok {
namespace {

std::string string_field(const nlohmann::json& object, const char* key, const std::string& path, size_t line_number,
                         const char* in = "") {
  const auto it = object.find(key);
  if (it == object.end()) detail::fail_file(path, "line ", line_number, ": ", in, "no \"", key, "\" field");
  if (!it->is_string()) detail::fail_file(path, "line ", line_number, ": ", in, "\"", key, "\" is not a string");
  return it->get<std::string>();
}

std::string unescape_newlines(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

void add_bos(const Tokenizer& t, MaskedIds& out) {
  if (t.special_tokens().bos) out.append({*t.special_tokens().bos}, 0);
}

void add_eos(const Tokenizer& t, MaskedIds& out) {
  if (t.special_tokens().eos) out.append({*t.special_tokens().eos}, 1);
}

}  // namespace

void MaskedIds::append(const std::vector<TokenId>& more, uint8_t mask) {
  ids.insert(ids.end(), more.begin(), more.end());
  loss_mask.insert(loss_mask.end(), more.size(), mask);
}

RoleTemplate RoleTemplate::parse(const std::vector<std::string>& pairs) {
  RoleTemplate t;
  for (const auto& pair : pairs) {
    const size_t eq = pair.find('=');
    MT_CHECK(eq != std::string::npos && eq > 0, "role template '", pair,
             "': expected ROLE=TEXT with {content} in TEXT");
    const std::string role = pair.substr(0, eq), format = unescape_newlines(pair.substr(eq + 1));
    MT_CHECK(format.find("{content}") != std::string::npos, "role template '", pair, "': TEXT has no {content}");
    MT_CHECK(t.formats_.emplace(role, format).second, "role template: role '", role, "' is given twice");
  }
  return t;
}

std::string RoleTemplate::render(const std::string& role, const std::string& content, const std::string& path,
                                 size_t line_number) const {
  const auto it = formats_.find(role);
  if (it == formats_.end()) {
    std::string known;
    for (const auto& [name, format] : formats_) known += (known.empty() ? "" : ", ") + name;
    detail::fail_file(path, "line ", line_number, ": role '", role, "' has no template (templates: ", known, ")");
  }
  std::string text = it->second;
  return text.replace(text.find("{content}"), 9, content);
}

MaskedIds encode_prompt_completion(const Tokenizer& tokenizer, std::string_view line, const std::string& path,
                                   size_t line_number) {
  const auto object = parse_jsonl_object(line, path, line_number);
  MaskedIds out;
  add_bos(tokenizer, out);
  out.append(tokenizer.encode(string_field(object, "prompt", path, line_number)), 0);
  const auto completion = tokenizer.encode(string_field(object, "completion", path, line_number));
  if (completion.empty()) detail::fail_file(path, "line ", line_number, ": the completion is empty");
  out.append(completion, 1);
  add_eos(tokenizer, out);
  return out;
}

MaskedIds encode_messages(const Tokenizer& tokenizer, const RoleTemplate& roles, std::string_view line,
                          const std::string& path, size_t line_number) {
  const auto object = parse_jsonl_object(line, path, line_number);
  const auto it = object.find("messages");
  if (it == object.end() || !it->is_array()) {
    detail::fail_file(path, "line ", line_number, ": no \"messages\" array");
  }
  MaskedIds out;
  add_bos(tokenizer, out);
  bool answered = false;
  for (const auto& message : *it) {
    if (!message.is_object()) detail::fail_file(path, "line ", line_number, ": a message is not a JSON object");
    const std::string role = string_field(message, "role", path, line_number, "a message has ");
    const std::string text =
        roles.render(role, string_field(message, "content", path, line_number, "a message has "), path, line_number);
    const bool trained = role == "assistant";
    answered |= trained;
    out.append(tokenizer.encode(text), trained ? 1 : 0);
  }
  if (!answered) detail::fail_file(path, "line ", line_number, ": no assistant message to train on");
  add_eos(tokenizer, out);
  return out;
}

}  // namespace mt::tok
