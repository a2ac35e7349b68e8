// UTF-8 helpers for the tokenizer: strict validation (the rules PCRE2 applies) and encoding of code points.
//
// "Strict" means RFC 3629: no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF. Pure functions;
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kestrel {

// Length (1..4) of the well-formed UTF-8 sequence that starts at text[pos], or 0 when the bytes there are not one.
// pos must be < text.size().
size_t utf8_sequence_length(std::string_view text, size_t pos);

// Offset of the first byte that does not start a well-formed sequence, or text.size() when all of text is valid.
size_t utf8_first_invalid(std::string_view text);

// Appends the UTF-8 form of code point cp (cp <= 0x10FFFF; surrogates are written as their 3-byte form).
void utf8_append(uint32_t cp, std::string& out);

// Decodes the well-formed sequence of length len (from utf8_sequence_length) at text[pos].
uint32_t utf8_decode_at(std::string_view text, size_t pos, size_t len);

}  // namespace kestrel
