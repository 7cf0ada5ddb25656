#include "tokenizers/byte_level.h"

#include <array>

#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

bool is_printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

struct ByteMap {
  std::array<std::string, 256> chars;
  std::array<int, 512> byte_of;  // code point -> byte, -1 if none (all mapped points are < 512)
  ByteMap() {
    byte_of.fill(-1);
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; ++b) {
      const char32_t c = is_printable(b) ? b : 256 + extra++;
      append_utf8(chars[b], c);
      byte_of[c] = static_cast<int>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const std::string& byte_to_chars(unsigned char b) { return byte_map().chars[b]; }

void append_byte_chars(std::string& out, std::string_view bytes) {
  const ByteMap& map = byte_map();
  for (const char b : bytes) out += map.chars[static_cast<unsigned char>(b)];
}

std::optional<unsigned char> char_to_byte(char32_t c) {
  if (c >= 512) return std::nullopt;
  const int b = byte_map().byte_of[c];
  if (b < 0) return std::nullopt;
  return static_cast<unsigned char>(b);
}

}  // namespace mt::tok
