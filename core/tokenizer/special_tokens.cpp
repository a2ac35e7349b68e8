// Special-token partition, as llama.cpp's tokenizer_st_partition (see special_tokens.h).
#include "core/tokenizer/special_tokens.h"

#include <algorithm>

#include "core/tokenizer/tokenizer.h"

namespace kestrel {

SpecialTokenMatcher::SpecialTokenMatcher(const std::vector<std::string>& tokens, const std::vector<TokenType>& types) {
  for (size_t id = 0; id < tokens.size() && id < types.size(); ++id) {
    const TokenType t = types[id];
    if (tokens[id].empty()) continue;
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined) {
      candidates_.push_back({tokens[id], static_cast<int32_t>(id), t == TokenType::kUserDefined});
    }
  }
  std::stable_sort(candidates_.begin(), candidates_.end(),
                   [](const Candidate& a, const Candidate& b) { return a.text.size() > b.text.size(); });
}

void SpecialTokenMatcher::partition(std::string_view text, bool parse_special, std::vector<TextFragment>& out) const {
  out.clear();
  if (text.empty()) return;
  out.push_back({0, text.size(), -1});
  std::vector<TextFragment> next;
  for (const Candidate& c : candidates_) {
    if (!parse_special && !c.always) continue;
    // Cheap reject: a token that occurs nowhere in the text cannot split anything.
    if (text.find(c.text) == std::string_view::npos) continue;
    next.clear();
    for (const TextFragment& f : out) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (pos < f.end) {
        const size_t match = text.substr(0, f.end).find(c.text, pos);
        if (match == std::string_view::npos) break;
        if (match > pos) next.push_back({pos, match, -1});
        next.push_back({match, match + c.text.size(), c.id});
        pos = match + c.text.size();
      }
      if (pos < f.end) next.push_back({pos, f.end, -1});
    }
    out.swap(next);
  }
}

}  // namespace kestrel
