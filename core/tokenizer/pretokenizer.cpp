// PreTokenizer: PCRE2-based splitting for "qwen2" and "qwen35" (see pretokenizer.h).
#include "core/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "core/tokenizer/utf8.h"

namespace kestrel {
namespace {

// Unicode White_Space, for use inside a character class (stands for `\s`).
constexpr std::string_view kWhiteSpaceClass =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// llama.cpp's patterns with `\s` -> [S] and `\S` -> [^S]. The original Hugging Face patterns start with the
// case-insensitive group (?i:'s|'t|'re|'ve|'m|'ll|'d); llama.cpp (and so Kestrel) spell it out per letter.
//   qwen2:  (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen35: letters widened to letters-or-marks: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+ and ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*
std::string make_pattern(bool marks) {
  const std::string s(kWhiteSpaceClass);
  std::string p = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
  p += marks ? "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+" : "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+";
  p += "|\\p{N}";
  p += marks ? "| ?[^" + s + "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" : "| ?[^" + s + "\\p{L}\\p{N}]+[\\r\\n]*";
  p += "|[" + s + "]*[\\r\\n]+";
  p += "|[" + s + "]+(?![^" + s + "])";
  p += "|[" + s + "]+";
  return p;
}

// ASCII character classes as the patterns see them. kSpace and kNewline are both `\s`.
enum AsciiClass : uint8_t { kOther, kLetter, kDigit, kSpace, kNewline, kNonAscii, kEnd };

struct AsciiTable {
  AsciiClass cls[128];
  constexpr AsciiTable() : cls() {
    for (int c = 0; c < 128; ++c) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        cls[c] = kLetter;
      } else if (c >= '0' && c <= '9') {
        cls[c] = kDigit;
      } else if (c == '\r' || c == '\n') {
        cls[c] = kNewline;
      } else if (c == '\t' || c == '\v' || c == '\f' || c == ' ') {
        cls[c] = kSpace;
      } else {
        cls[c] = kOther;
      }
    }
  }
};
constexpr AsciiTable kAscii;

// The length of the match that starts at text[i] (an ASCII byte of valid UTF-8), worked out by hand for the
// qwen2/qwen35 patterns (identical on ASCII: they differ only in \p{M}, which has no ASCII members), or 0 when a
// non-ASCII character takes part in the decision (the caller then asks PCRE2). Mirrors the alternatives in order.
size_t ascii_match(std::string_view text, size_t i) {
  const size_t n = text.size();
  auto cls = [&](size_t k) -> AsciiClass {
    if (k >= n) return kEnd;
    const auto c = static_cast<unsigned char>(text[k]);
    return c < 128 ? kAscii.cls[c] : kNonAscii;
  };
  auto lower = [&](size_t k) -> char { return k < n ? static_cast<char>(text[k] | 0x20) : '\0'; };
  const AsciiClass c0 = cls(i);
  // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
  if (text[i] == '\'') {
    const char a = lower(i + 1);
    const char b = lower(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' || a == 'v') && b == 'e') return 3;
    if (a == 'l' && b == 'l') return 3;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t run = n;  // start of the letter run, if any
  if (c0 == kLetter) {
    run = i;
  } else if (c0 == kOther || c0 == kSpace) {
    const AsciiClass c1 = cls(i + 1);
    if (c1 == kNonAscii) return 0;
    if (c1 == kLetter) run = i + 1;
  }
  if (run != n) {
    size_t j = run;
    while (cls(j) == kLetter) ++j;
    return cls(j) == kNonAscii ? 0 : j - i;
  }
  // \p{N}
  if (c0 == kDigit) return 1;
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t j = text[i] == ' ' ? i + 1 : i;
  if (cls(j) == kNonAscii) return 0;
  if (cls(j) == kOther) {
    while (cls(j) == kOther) ++j;
    if (cls(j) == kNonAscii) return 0;
    while (cls(j) == kNewline) ++j;
    return j - i;
  }
  // \s*[\r\n]+ | \s+(?!\S) | \s+ : c0 is whitespace here.
  size_t last_newline = n;
  j = i;
  for (AsciiClass c = cls(j); c == kSpace || c == kNewline; c = cls(++j)) {
    if (c == kNewline) last_newline = j;
  }
  if (cls(j) == kNonAscii) return 0;  // U+0085, U+3000, ... would continue the run
  if (last_newline != n) return last_newline + 1 - i;
  if (j == n) return j - i;
  return j - i >= 2 ? j - 1 - i : 1;
}

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

struct PreTokenizer::Impl {
  std::string name;
  std::unique_ptr<pcre2_code, CodeDeleter> code;
  bool jit = false;

  // Splits valid UTF-8 `subject`; calls emit(begin, end) for each piece in order. ascii_fast_path: decide
  // ASCII-only matches by hand (identical results; PCRE2 still handles every match that involves other characters).
  template <class Emit>
  void split_valid(std::string_view subject, bool ascii_fast_path, Emit&& emit) const;
};

template <class Emit>
void PreTokenizer::Impl::split_valid(std::string_view subject, bool ascii_fast_path, Emit&& emit) const {
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code.get(), nullptr));
  size_t pos = 0;
  while (pos < n) {
    if (ascii_fast_path && static_cast<unsigned char>(subject[pos]) < 0x80) {
      const size_t len = ascii_match(subject, pos);
      if (len > 0) {
        emit(pos, pos + len);
        pos += len;
        continue;
      }
    }
    int rc = jit ? pcre2_jit_match(code.get(), data, n, pos, 0, md.get(), nullptr) : PCRE2_ERROR_JIT_BADOPTION;
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // JIT missing or out of JIT stack: the interpreter (heap frames) gives the same answer.
      rc = pcre2_match(code.get(), data, n, pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    }
    if (rc < 0) {
      // No further match (or a resource limit on pathological input): the rest is one piece.
      emit(pos, n);
      return;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t match_begin = ov[0];
    size_t match_end = ov[1];
    if (match_end == match_begin) {
      // These patterns never match empty; if one did, take one character so the loop always advances.
      match_end = match_begin + utf8_sequence_length(subject, match_begin);
    }
    if (match_begin > pos) emit(pos, match_begin);
    emit(match_begin, match_end);
    pos = match_end;
  }
}

PreTokenizer::PreTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

Expected<std::string> PreTokenizer::pattern_for(std::string_view name) {
  if (name == "qwen2") return make_pattern(false);
  if (name == "qwen35") return make_pattern(true);
  return make_error(ErrorCode::kUnsupported, "unknown pre-tokenizer '" + std::string(name) +
                                                 "' (tokenizer.ggml.pre); Kestrel implements \"qwen2\" and \"qwen35\"");
}

Expected<PreTokenizer> PreTokenizer::create(std::string_view name) {
  KESTREL_TRY_ASSIGN(const std::string pattern, pattern_for(name));
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return make_error(ErrorCode::kInternal, "PCRE2 rejected the '" + std::string(name) + "' pattern at offset " +
                                                std::to_string(error_offset) + ": " +
                                                reinterpret_cast<const char*>(message));
  }
  auto impl = std::make_unique<Impl>();
  impl->name = std::string(name);
  impl->code.reset(code);
  impl->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return PreTokenizer(std::move(impl));
}

const std::string& PreTokenizer::name() const { return impl_->name; }

void PreTokenizer::split(std::string_view text, std::vector<TextSpan>& pieces) const {
  split_impl(text, /*ascii_fast_path=*/true, pieces);
}

void PreTokenizer::split_pcre2_only(std::string_view text, std::vector<TextSpan>& pieces) const {
  split_impl(text, /*ascii_fast_path=*/false, pieces);
}

void PreTokenizer::split_impl(std::string_view text, bool ascii_fast_path, std::vector<TextSpan>& pieces) const {
  const size_t first_invalid = utf8_first_invalid(text);
  if (first_invalid == text.size()) {
    impl_->split_valid(text, ascii_fast_path, [&](size_t b, size_t e) { pieces.push_back({b, e}); });
    return;
  }
  // Invalid UTF-8: split a copy in which every bad byte is U+FFFD, then map piece boundaries back to `text`.
  std::string subject;
  std::vector<size_t> original;  // original[i]: offset in `text` of subject byte i (and of subject's end)
  subject.reserve(text.size() + 16);
  original.reserve(text.size() + 16);
  subject.append(text.substr(0, first_invalid));
  for (size_t i = 0; i < first_invalid; ++i) original.push_back(i);
  size_t pos = first_invalid;
  while (pos < text.size()) {
    const size_t len = utf8_sequence_length(text, pos);
    if (len == 0) {
      subject.append("\xEF\xBF\xBD");
      original.insert(original.end(), 3, pos);
      pos += 1;
    } else {
      subject.append(text.substr(pos, len));
      for (size_t i = 0; i < len; ++i) original.push_back(pos + i);
      pos += len;
    }
  }
  original.push_back(text.size());
  impl_->split_valid(subject, ascii_fast_path, [&](size_t b, size_t e) {
    pieces.push_back({original[b], original[e]});
  });
}

}  // namespace kestrel
