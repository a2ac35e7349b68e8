// PreTokenizer: splits text into the pieces byte-level BPE merges within ("qwen2" / "qwen35", model-spec §10).
//
// The split is llama.cpp's: one PCRE2 regex (UTF + UCP, JIT-compiled once at create()) run over the text; every
// match is a piece, and text between matches (none for these patterns on valid UTF-8) is a piece too, so the
// pieces tile the text exactly. Two deliberate details:
//  - `\s` / `\S` are spelled out as Unicode White_Space (U+0009..000D, 0020, 0085, 00A0, 1680, 2000..200A, 2028,
//    2029, 202F, 205F, 3000), the set llama.cpp's unicode tables and Hugging Face's Oniguruma use; PCRE2 before
//    10.43 leaves U+0085 out of `\s`, so writing the set keeps splits independent of the PCRE2 version.
//  - Invalid UTF-8: each byte that does not start a well-formed sequence is split as if it were U+FFFD (what
//    llama.cpp substitutes), but the piece keeps the original byte, so byte-level BPE still round-trips it.
//
// Speed: a match that starts on an ASCII byte and whose extent depends only on ASCII bytes is found by a hand-written
// matcher that mirrors the pattern's alternatives (letters, digits, punctuation runs, whitespace runs); every other
// match comes from PCRE2. Tests check the two agree on random mixed text.
//
// Immutable after create(); split() is const and thread-safe (each call uses its own match data). Move-only.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"

namespace kestrel {

// A piece of text: bytes [begin, end) of the string that was split.
struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
};

class PreTokenizer {
 public:
  // name: tokenizer.ggml.pre, "qwen2" or "qwen35"; kUnsupported for anything else.
  static Expected<PreTokenizer> create(std::string_view name);

  // The regex for a pre-tokenizer name as PCRE2 sees it; kUnsupported for unknown names.
  static Expected<std::string> pattern_for(std::string_view name);

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends the pieces of `text` to `pieces` (in order; together they cover text exactly; none is empty).
  void split(std::string_view text, std::vector<TextSpan>& pieces) const;
  // The same without the hand-written ASCII matcher (every match from PCRE2); tests compare the two.
  void split_pcre2_only(std::string_view text, std::vector<TextSpan>& pieces) const;

  const std::string& name() const;

 private:
  struct Impl;
  explicit PreTokenizer(std::unique_ptr<Impl> impl);
  void split_impl(std::string_view text, bool ascii_fast_path, std::vector<TextSpan>& pieces) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel
