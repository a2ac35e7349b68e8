// UTF-8 validation and encoding (see utf8.h).
#include "core/tokenizer/utf8.h"

#include <cstring>

namespace kestrel {

size_t utf8_sequence_length(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t left = text.size() - pos;
  const unsigned char b0 = s[0];
  if (b0 < 0x80) return 1;
  auto cont = [&](size_t i) { return i < left && (s[i] & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 2) return 0;
    const unsigned char b1 = s[1];
    if (b0 == 0xE0 && b1 < 0xA0) return 0;   // overlong
    if (b0 == 0xED && b1 >= 0xA0) return 0;  // surrogate
    return cont(1) && cont(2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 2) return 0;
    const unsigned char b1 = s[1];
    if (b0 == 0xF0 && b1 < 0x90) return 0;   // overlong
    if (b0 == 0xF4 && b1 >= 0x90) return 0;  // above U+10FFFF
    return cont(1) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;  // continuation byte, C0/C1 (overlong) or F5..FF
}

size_t utf8_first_invalid(std::string_view text) {
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    // ASCII runs dominate most text: skip 8 bytes at a time while none has its top bit set.
    while (pos + 8 <= n) {
      uint64_t word = 0;
      std::memcpy(&word, text.data() + pos, sizeof(word));
      if (word & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= n) break;
    const size_t len = utf8_sequence_length(text, pos);
    if (len == 0) return pos;
    pos += len;
  }
  return n;
}

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t utf8_decode_at(std::string_view text, size_t pos, size_t len) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t{s[0] & 0x1Fu} << 6) | (s[1] & 0x3Fu);
    case 3: return (uint32_t{s[0] & 0x0Fu} << 12) | (uint32_t{s[1] & 0x3Fu} << 6) | (s[2] & 0x3Fu);
    default:
      return (uint32_t{s[0] & 0x07u} << 18) | (uint32_t{s[1] & 0x3Fu} << 12) | (uint32_t{s[2] & 0x3Fu} << 6) |
             (s[3] & 0x3Fu);
  }
}

}  // namespace kestrel
