// Fine-tuning examples as token ids with a loss mask: only the answer is trained on.
//
//   {"prompt": "...", "completion": "..."}            (--format prompt-completion)
//   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}, ...]}
//                                                      (--format messages, with a RoleTemplate)
//
// An example becomes [bos] prompt-ids completion-ids [eos] (bos and eos where the tokenizer has
// them), each part encoded on its own. The mask is 1 on the completion's ids and the eos (the
// model learns to stop) and 0 on bos and the prompt: those positions are inputs, never targets,
// and contribute nothing to the loss or its mean. With messages, every assistant message is
// a completion and everything else prompt, each message rendered by the template of its role.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace mt::tok {

struct MaskedIds {
  std::vector<TokenId> ids;
  std::vector<uint8_t> loss_mask;  // [ids.size()], 1 = trained on
  void append(const std::vector<TokenId>& more, uint8_t mask);
};

// How each role's message is written out: "{content}" stands for the message text, "\n" in the
// command line's text for a newline. Parsed from "role=text" pairs, e.g.
//   user=<|user|>\n{content}\n   assistant=<|assistant|>\n{content}\n
class RoleTemplate {
 public:
  // Throws mt::Error naming the bad pair: no '=', an empty role, no {content}, a role twice.
  static RoleTemplate parse(const std::vector<std::string>& pairs);
  // Throws FileError (path and line) for a role the template does not know.
  std::string render(const std::string& role, const std::string& content, const std::string& path,
                     size_t line_number) const;
  bool empty() const { return formats_.empty(); }

 private:
  std::map<std::string, std::string> formats_;
};

// One JSONL line of either form into ids and mask. Throws FileError naming the path and line:
// not JSON, a missing or non-string field, no completion / assistant message, an unknown role.
MaskedIds encode_prompt_completion(const Tokenizer& tokenizer, std::string_view line, const std::string& path,
                                   size_t line_number);
MaskedIds encode_messages(const Tokenizer& tokenizer, const RoleTemplate& roles, std::string_view line,
                          const std::string& path, size_t line_number);

}  // namespace mt::tok
