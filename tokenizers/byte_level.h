// GPT-2's byte-to-character map: each byte becomes one printable character, so that byte-level
// BPE works on strings of characters. Printable Latin-1 bytes map to themselves; the other 68
// bytes (controls, space, 0x7F-0xA0, 0xAD) map to U+0100 onwards in byte order, so space is 'Ġ'.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace mt::tok {

// The UTF-8 of the character that stands for byte `b`.
const std::string& byte_to_chars(unsigned char b);
// Appends the characters standing for each byte of `bytes`.
void append_byte_chars(std::string& out, std::string_view bytes);
// The byte that character `c` stands for, if it stands for one.
std::optional<unsigned char> char_to_byte(char32_t c);

// The pattern GPT-2 splits text with before byte-level BPE (Hugging Face's ByteLevel use_regex).
extern const char* const kGpt2SplitPattern;

}  // namespace mt::tok
