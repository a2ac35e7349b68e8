// TextStream (text_stream.h): UTF-8 hold-back and stop-string matching over a generation's token bytes.
#include "daemon/engine/text_stream.h"

#include <algorithm>
#include <utility>

#include "core/tokenizer/utf8.h"

namespace kestrel::daemon {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Sequence length announced by a lead byte, 0 when it cannot start a well-formed sequence (RFC 3629).
size_t lead_length(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether `second` may follow `lead` in a well-formed sequence (no overlongs, no surrogates, <= U+10FFFF).
bool second_ok(uint8_t lead, uint8_t second) {
  if ((second & 0xC0) != 0x80) return false;
  if (lead == 0xE0) return second >= 0xA0;
  if (lead == 0xED) return second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90;
  if (lead == 0xF4) return second <= 0x8F;
  return true;
}

}  // namespace

size_t utf8_incomplete_tail(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const auto b = static_cast<uint8_t>(bytes[n - k]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: the lead is further back
    const size_t len = lead_length(b);
    if (len <= k) return 0;  // complete (or not a lead at all)
    if (k >= 2 && !second_ok(b, static_cast<uint8_t>(bytes[n - k + 1]))) return 0;
    return k;
  }
  return 0;
}

void append_utf8_sanitized(std::string_view bytes, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t first_bad = i + utf8_first_invalid(bytes.substr(i));
    out.append(bytes.substr(i, first_bad - i));
    if (first_bad >= bytes.size()) break;
    out.append(kReplacement);
    i = first_bad + 1;
  }
}

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings) : tokenizer_(tokenizer) {
  for (const std::string& s : stop_strings) {
    if (s.empty()) continue;
    // Valid UTF-8 needles in a valid UTF-8 haystack only ever match at character boundaries.
    std::string clean;
    append_utf8_sanitized(s, clean);
    stop_.push_back(std::move(clean));
  }
}

Expected<std::string> TextStream::push(int32_t token) {
  KESTREL_TRY_ASSIGN(std::string_view bytes, tokenizer_.token_bytes(token));
  if (stopped_) return std::string();
  raw_.append(bytes);
  return release(/*final=*/false);
}

std::string TextStream::finish() {
  if (stopped_) return std::string();
  return release(/*final=*/true);
}

std::string TextStream::release(bool final) {
  const size_t tail = utf8_incomplete_tail(raw_);
  append_utf8_sanitized(std::string_view(raw_).substr(0, raw_.size() - tail), text_);
  raw_.erase(0, raw_.size() - tail);
  if (final && !raw_.empty()) {  // an unfinished character at the end: one replacement character
    text_.append(kReplacement);
    raw_.clear();
  }

  // The earliest full occurrence of any stop string ends the generation; the text before it is released.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, text_.find(s));
  if (cut != std::string::npos) {
    std::string out = text_.substr(0, cut);
    text_.clear();
    raw_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest suffix of text_ that is a proper prefix of a stop string.
  size_t hold = 0;
  if (!final) {
    for (const std::string& s : stop_) {
      for (size_t len = std::min(s.size() - 1, text_.size()); len > hold; --len) {
        if (std::string_view(text_).substr(text_.size() - len) == std::string_view(s).substr(0, len)) {
          hold = len;
          break;
        }
      }
    }
  }
  std::string out = text_.substr(0, text_.size() - hold);
  text_.erase(0, text_.size() - hold);
  return out;
}

}  // namespace kestrel::daemon
