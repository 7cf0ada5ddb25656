// UTF-8 helpers shared by the tokenizers.
//
// Invalid UTF-8: every tokenizer but the byte tokenizer first replaces each maximal invalid
// subpart of its input with U+FFFD, exactly as Python's bytes.decode("utf-8", errors="replace")
// does (the Unicode Standard's "substitution of maximal subparts", chapter 3.9). Hugging Face's
// tokenizers and SentencePiece accept only valid strings, so this is the string they would be
// given by a Python caller reading the same bytes, and our ids equal theirs on it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mt::tok {

// The length in bytes of the valid UTF-8 sequence starting at text[i], or 0 if none starts there.
int utf8_sequence_length(std::string_view text, size_t i);

// True if `text` is valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view text);

// `text` with each maximal invalid subpart replaced by U+FFFD (see above).
std::string replace_invalid_utf8(std::string_view text);

// The code point of the valid sequence at text[i] (of length utf8_sequence_length(text, i)).
char32_t decode_code_point(std::string_view text, size_t i, int length);

// Appends the UTF-8 encoding of `c` (c <= U+10FFFF, not a surrogate).
void append_utf8(std::string& out, char32_t c);

}  // namespace mt::tok
