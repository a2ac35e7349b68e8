// GPT-2 byte <-> unicode table (see byte_unicode.h).
#include "core/tokenizer/byte_unicode.h"

#include <array>
#include <cstdio>

#include "core/tokenizer/utf8.h"

namespace kestrel {
namespace {

struct ByteTables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 0x144> cp_to_byte{};   // every code point the table uses is < U+0144
  std::array<char, size_t{256} * 2> utf8{};  // UTF-8 of byte_to_cp[b] at [2b, 2b + utf8_len[b])
  std::array<uint8_t, 256> utf8_len{};
};

ByteTables make_tables() {
  ByteTables t;
  t.cp_to_byte.fill(-1);
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
    t.byte_to_cp[b] = cp;
    t.cp_to_byte[cp] = static_cast<int16_t>(b);
    std::string s;
    utf8_append(cp, s);
    t.utf8_len[b] = static_cast<uint8_t>(s.size());
    for (size_t i = 0; i < s.size(); ++i) t.utf8[2 * static_cast<size_t>(b) + i] = s[i];
  }
  return t;
}

const ByteTables& tables() {
  static const ByteTables t = make_tables();
  return t;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().byte_to_cp[b]; }

std::string_view byte_to_utf8(uint8_t b) {
  const ByteTables& t = tables();
  return {t.utf8.data() + 2 * size_t{b}, t.utf8_len[b]};
}

int codepoint_to_byte(uint32_t cp) { return cp < tables().cp_to_byte.size() ? tables().cp_to_byte[cp] : -1; }

void byte_level_encode(std::string_view bytes, std::string& out) {
  const ByteTables& t = tables();
  for (const char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out.append(t.utf8.data() + 2 * size_t{b}, t.utf8_len[b]);
  }
}

Status byte_level_decode(std::string_view text, std::string& out) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = utf8_sequence_length(text, pos);
    if (len == 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "byte-level text is not valid UTF-8 at byte " + std::to_string(pos));
    }
    const uint32_t cp = utf8_decode_at(text, pos, len);
    const int b = codepoint_to_byte(cp);
    if (b < 0) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "U+%04X", cp);
      return make_error(ErrorCode::kInvalidArgument, std::string("byte-level text holds ") + buf + " at byte " +
                                                         std::to_string(pos) + ", which no byte is written as");
    }
    out.push_back(static_cast<char>(b));
    pos += len;
  }
  return ok_status();
}

}  // namespace kestrel
