// Text-formatting helpers for the `kestrel` CLI (see cli_format.h).
#include "client/cli/cli_format.h"

#include <cstdio>
#include <string>

#include "core/base/byte_size.h"

namespace kestrel::cli {

std::string format_bytes(uint64_t bytes) { return format_byte_size(bytes); }

std::string format_percent(uint64_t part, uint64_t whole) {
  char buf[32];
  const double pct = whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  std::snprintf(buf, sizeof(buf), "%.1f%%", pct);
  return buf;
}

std::string format_shape(std::span<const uint64_t> ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "}";
}

std::string format_count(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_error(std::string_view subject, std::string_view message) {
  std::string msg(message);
  for (char& c : msg) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::string prefix = std::string(subject) + ": ";
  if (!subject.empty() && msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
  std::fprintf(stderr, "kestrel: error: %s%s\n", subject.empty() ? "" : prefix.c_str(), msg.c_str());
}

}  // namespace kestrel::cli
