// SentencePiece models (tokenizer.model, as Llama 2 and Mistral ship them) through the
// SentencePiece library itself (Debian's libsentencepiece-dev), so the ids are its ids.
// add_special_tokens puts the model's bos in front, as Llama's tokenizers do.
#pragma once

#include <memory>
#include <string>

#include "tokenizers/tokenizer.h"

namespace mt::tok {

// Throws FileError naming the file when it is not a SentencePiece model, and NotImplementedError
// when this build has no SentencePiece.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

// True if this build has the SentencePiece library.
bool have_sentencepiece();

}  // namespace mt::tok
