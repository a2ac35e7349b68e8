// PreTokenizer: PCRE2-based splitting for "qwen2" and "qwen35" (see pretokenizer.h).
#include "core/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "core/tokenizer/utf8.h"

namespace kestrel {
namespace {

// Unicode White_Space, for use inside a character class (stands for `\s`).
constexpr std::string_view kSpace =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// llama.cpp's patterns with `\s` -> [S] and `\S` -> [^S]. The original Hugging Face patterns start with the
// case-insensitive group (?i:'s|'t|'re|'ve|'m|'ll|'d); llama.cpp (and so Kestrel) spell it out per letter.
//   qwen2:  (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen35: letters widened to letters-or-marks: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+ and ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*
std::string make_pattern(bool marks) {
  const std::string s(kSpace);
  std::string p = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
  p += marks ? "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+" : "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+";
  p += "|\\p{N}";
  p += marks ? "| ?[^" + s + "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" : "| ?[^" + s + "\\p{L}\\p{N}]+[\\r\\n]*";
  p += "|[" + s + "]*[\\r\\n]+";
  p += "|[" + s + "]+(?![^" + s + "])";
  p += "|[" + s + "]+";
  return p;
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

  // Splits valid UTF-8 `subject`; calls emit(begin, end) for each piece in order.
  template <class Emit>
  void split_valid(std::string_view subject, Emit&& emit) const;
};

template <class Emit>
void PreTokenizer::Impl::split_valid(std::string_view subject, Emit&& emit) const {
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code.get(), nullptr));
  size_t pos = 0;
  while (pos < n) {
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
  const size_t first_invalid = utf8_first_invalid(text);
  if (first_invalid == text.size()) {
    impl_->split_valid(text, [&](size_t b, size_t e) { pieces.push_back({b, e}); });
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
  impl_->split_valid(subject, [&](size_t b, size_t e) { pieces.push_back({original[b], original[e]}); });
}

}  // namespace kestrel
