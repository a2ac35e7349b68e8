// SpecialTokenMatcher: cuts control / user-defined token texts out of raw text before pre-tokenization.
//
// The algorithm is llama.cpp's tokenizer_st_partition, reproduced exactly because its result can differ from a
// leftmost-longest scan: candidate tokens are taken one at a time, longest text first (ties: lower id first), and
// each one is searched left to right in every still-raw fragment; every occurrence becomes a token fragment and
// splits the raw fragment around it. Which tokens take part:
//  - kUserDefined: always (Hugging Face and llama.cpp extract non-special added tokens such as "<think>" whether or
//    not specials are parsed);
//  - kControl and kUnknown: only when parse_special is true (otherwise "<|im_start|>" is plain text).
// Tokens with empty text never match.
//
// Immutable after build(); partition() is const and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel {

enum class TokenType : int32_t;

// A part of the text: raw bytes [begin, end) when token < 0, else the token `token` (which covered [begin, end)).
struct TextFragment {
  size_t begin = 0;
  size_t end = 0;
  int32_t token = -1;
};

class SpecialTokenMatcher {
 public:
  SpecialTokenMatcher() = default;
  SpecialTokenMatcher(const std::vector<std::string>& tokens, const std::vector<TokenType>& types);

  // Fragments of `text` in order; they tile the text. Replaces the contents of `out`.
  void partition(std::string_view text, bool parse_special, std::vector<TextFragment>& out) const;

  size_t size() const { return candidates_.size(); }

 private:
  struct Candidate {
    std::string text;
    int32_t id;
    bool always;  // user-defined: matched even when parse_special is false
  };
  std::vector<Candidate> candidates_;  // longest text first
};

}  // namespace kestrel
