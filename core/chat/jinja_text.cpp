// Python str semantics over UTF-8 (see jinja_text.h).
#include "core/chat/jinja_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace kestrel::chat::jinja {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    char32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += len;
  }
  return true;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  char32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  out.push_back(s.size());
  return out;
}

bool py_isspace(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool py_isprintable(char32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0xA0) return cp < 0x80;  // C1 controls
  if (cp == 0xA0 || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
      (cp >= 0x205F && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) {
    return false;
  }
  if ((cp >= 0x0600 && cp <= 0x0605) || cp == 0x061C || cp == 0x06DD || cp == 0x070F || cp == 0x0890 || cp == 0x0891 ||
      cp == 0x08E2 || cp == 0x180E || (cp >= 0xFFF9 && cp <= 0xFFFB)) {
    return false;
  }
  if (cp >= 0xD800 && cp <= 0xF8FF) return false;  // surrogates and the private use area
  if (cp == 0x110BD || cp == 0x110CD || (cp >= 0x13430 && cp <= 0x1343F) || (cp >= 0x1BCA0 && cp <= 0x1BCA3) ||
      (cp >= 0x1D173 && cp <= 0x1D17A) || cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F)) {
    return false;
  }
  if (cp >= 0xF0000) return false;  // supplementary private use areas
  return true;
}

namespace {

// The byte length of the whitespace code point that starts at s[i], or 0.
size_t space_at(std::string_view s, size_t i) {
  size_t j = i;
  const char32_t cp = next_code_point(s, j);
  return py_isspace(cp) ? j - i : 0;
}

// The byte length of the whitespace code point that ends at s[end), or 0.
size_t space_before(std::string_view s, size_t end) {
  size_t start = end;
  do {
    --start;
  } while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80);
  size_t j = start;
  const char32_t cp = next_code_point(s, j);
  return py_isspace(cp) ? end - start : 0;
}

bool in_set(char32_t cp, std::string_view chars) {
  size_t i = 0;
  while (i < chars.size()) {
    if (next_code_point(chars, i) == cp) return true;
  }
  return false;
}

}  // namespace

std::string_view py_strip(std::string_view s, StripSide side) {
  size_t b = 0, e = s.size();
  if (side != StripSide::kRight) {
    while (b < e) {
      const size_t n = space_at(s, b);
      if (n == 0) break;
      b += n;
    }
  }
  if (side != StripSide::kLeft) {
    while (e > b) {
      const size_t n = space_before(s, e);
      if (n == 0) break;
      e -= n;
    }
  }
  return s.substr(b, e - b);
}

std::string_view py_strip_chars(std::string_view s, std::string_view chars, StripSide side) {
  const std::vector<size_t> off = code_point_offsets(s);
  size_t b = 0, e = off.size() - 1;  // code point indices [b, e)
  auto cp_at = [&](size_t k) {
    size_t i = off[k];
    return next_code_point(s, i);
  };
  if (side != StripSide::kRight) {
    while (b < e && in_set(cp_at(b), chars)) ++b;
  }
  if (side != StripSide::kLeft) {
    while (e > b && in_set(cp_at(e - 1), chars)) --e;
  }
  return s.substr(off[b], off[e] - off[b]);
}

std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t pos = 0;
  int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    const size_t at = s.find(sep, pos);
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, at - pos));
    pos = at + sep.size();
    ++splits;
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    while (i < n) {  // skip a run of whitespace
      const size_t w = space_at(s, i);
      if (w == 0) break;
      i += w;
    }
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(i));  // the rest, trailing whitespace included, as CPython does
      return out;
    }
    const size_t start = i;
    while (i < n && space_at(s, i) == 0) next_code_point(s, i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::vector<size_t> off = code_point_offsets(s);
    const size_t n_cp = off.size() - 1;
    int64_t done = 0;
    for (size_t k = 0; k <= n_cp; ++k) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      if (k < n_cp) out += s.substr(off[k], off[k + 1] - off[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out += s.substr(pos, at - pos);
    out += rep;
    pos = at + old.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

uint64_t py_replace_size(std::string_view s, std::string_view old, std::string_view rep, int64_t count) {
  uint64_t n = static_cast<uint64_t>(py_count(s, old));
  if (count >= 0) n = std::min<uint64_t>(n, static_cast<uint64_t>(count));
  return s.size() - n * old.size() + n * rep.size();
}

int64_t py_find(std::string_view s, std::string_view sub) {
  const size_t at = s.find(sub);
  if (at == std::string_view::npos) return -1;
  return static_cast<int64_t>(code_point_count(s.substr(0, at)));
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(code_point_count(s)) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = s.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

std::string py_repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  char buf[16];
  while (i < s.size()) {
    const char32_t cp = next_code_point(s, i);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (py_isprintable(cp)) {
      append_utf8(out, cp);
    } else if (cp <= 0xFF) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
      out += buf;
    } else if (cp <= 0xFFFF) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    }
  }
  out += quote;
  return out;
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits (the same choice as CPython's repr), then CPython's layout rules.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out += '-';
    i = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e_pos; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  int exp10 = 0;
  std::from_chars(sci.data() + e_pos + (sci[e_pos + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exp10);
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int nd = static_cast<int>(digits.size());
  if (decpt > 16 || decpt <= -4) {
    out += digits[0];
    if (nd > 1) {
      out += '.';
      out += digits.substr(1);
    }
    const int e = decpt - 1;
    std::snprintf(buf, sizeof buf, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    out += buf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= nd) {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

namespace {

// Blocks that hold letters with case mappings (Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, Glagolitic,
// Coptic, Deseret, Osage, Adlam, ... and the letterlike, Roman numeral, circled and fullwidth forms).
bool may_have_case(char32_t cp) {
  return (cp >= 0xB5 && cp <= 0x058F) || (cp >= 0x10A0 && cp <= 0x10FF) || (cp >= 0x13A0 && cp <= 0x13FF) ||
         (cp >= 0x1C80 && cp <= 0x1CBF) || (cp >= 0x1D00 && cp <= 0x1FFF) || (cp >= 0x2100 && cp <= 0x218F) ||
         (cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x2C00 && cp <= 0x2D2F) || (cp >= 0x2DE0 && cp <= 0x2DFF) ||
         (cp >= 0xA640 && cp <= 0xA7FF) || (cp >= 0xAB30 && cp <= 0xABBF) || (cp >= 0xFB00 && cp <= 0xFB17) ||
         (cp >= 0xFF21 && cp <= 0xFF5A) || (cp >= 0x10400 && cp <= 0x104FF) || (cp >= 0x10570 && cp <= 0x105BF) ||
         (cp >= 0x10C80 && cp <= 0x10CFF) || (cp >= 0x118A0 && cp <= 0x118FF) || (cp >= 0x16E40 && cp <= 0x16E9F) ||
         (cp >= 0x1E900 && cp <= 0x1E95F);
}

}  // namespace

bool ascii_case_map(std::string_view s, bool upper, std::string& out) {
  out.clear();
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t cp = next_code_point(s, i);
    if (cp >= 0x80) {
      if (may_have_case(cp)) return false;
      out.append(s.substr(start, i - start));
    } else if (upper && cp >= 'a' && cp <= 'z') {
      out += static_cast<char>(cp - 'a' + 'A');
    } else if (!upper && cp >= 'A' && cp <= 'Z') {
      out += static_cast<char>(cp - 'A' + 'a');
    } else {
      out += static_cast<char>(cp);
    }
  }
  return true;
}

}  // namespace kestrel::chat::jinja
