// GPT-2's byte <-> unicode table: how byte-level BPE writes arbitrary bytes as printable text.
//
// Every byte b maps to one code point: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves and
// the other 68 bytes to U+0100.. in increasing byte order (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). Token
// texts in tokenizer.json / GGUF are written with this table; the tokenizer maps raw bytes through it before the
// merges and maps token texts back through its inverse when decoding. Tables are constants; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/expected.h"

namespace kestrel {

// The code point byte b is written as (< U+0144).
uint32_t byte_to_codepoint(uint8_t b);

// The UTF-8 of byte_to_codepoint(b): 1 or 2 bytes; the view is into a static table.
std::string_view byte_to_utf8(uint8_t b);

// The byte written as code point cp, or -1 when cp is not in the table.
int codepoint_to_byte(uint32_t cp);

// Appends the byte-level text of raw bytes (each byte becomes 1 or 2 UTF-8 bytes).
void byte_level_encode(std::string_view bytes, std::string& out);

// Appends the raw bytes that byte-level text stands for. kInvalidArgument (naming the offset and code point) when
// the text is not valid UTF-8 or holds a code point outside the table; `out` then holds the bytes decoded so far.
Status byte_level_decode(std::string_view text, std::string& out);

}  // namespace kestrel
