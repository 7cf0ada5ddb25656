#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// The valid range of the second byte after lead byte `lead` (Unicode Table 3-7); false when
// `lead` cannot start a sequence. The later bytes are plain continuation bytes.
bool second_byte_range(unsigned char lead, unsigned char& lo, unsigned char& hi, int& length) {
  lo = 0x80;
  hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;  // no overlongs
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return false;
  }
  return true;
}

// The number of bytes starting at text[i] that form one maximal subpart: either a whole valid
// sequence (sets `valid`) or the longest prefix of one, which is replaced as a unit.
int maximal_subpart(std::string_view text, size_t i, bool& valid) {
  const auto lead = static_cast<unsigned char>(text[i]);
  valid = false;
  if (lead < 0x80) {
    valid = true;
    return 1;
  }
  unsigned char lo, hi;
  int length;
  if (!second_byte_range(lead, lo, hi, length)) return 1;
  if (i + 1 >= text.size()) return 1;
  const auto second = static_cast<unsigned char>(text[i + 1]);
  if (second < lo || second > hi) return 1;
  int taken = 2;
  while (taken < length && i + taken < text.size() && is_continuation(static_cast<unsigned char>(text[i + taken]))) {
    ++taken;
  }
  valid = taken == length;
  return taken;
}

}  // namespace

int utf8_sequence_length(std::string_view text, size_t i) {
  bool valid;
  const int n = maximal_subpart(text, i, valid);
  return valid ? n : 0;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const int n = utf8_sequence_length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string replace_invalid_utf8(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) {
    bool valid;
    const int n = maximal_subpart(text, i, valid);
    if (valid) {
      out.append(text.substr(i, n));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += n;
  }
  return out;
}

char32_t decode_code_point(std::string_view text, size_t i, int length) {
  const auto b = [&](int k) { return static_cast<char32_t>(static_cast<unsigned char>(text[i + k])); };
  switch (length) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace mt::tok
