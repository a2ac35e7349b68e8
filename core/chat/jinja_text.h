// Python `str` semantics over UTF-8 text, for the Jinja interpreter (core/chat).
//
// Jinja templates run on Python strings: indices, lengths and slices count code points, str.strip() and str.split()
// with no argument use str.isspace(), repr() chooses its quotes and escapes non-printable characters, and floats
// print as repr(float) (shortest round-trip digits, exponent form outside 1e-4 <= |x| < 1e16). These helpers give
// the same results over valid UTF-8 (every string the interpreter holds is checked once on entry).
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::chat::jinja {

bool valid_utf8(std::string_view s);
// The code point that starts at s[i] (s valid UTF-8); advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
size_t code_point_count(std::string_view s);
// Byte offset of every code point of s, then s.size(): offsets[k] .. offsets[k + 1] is code point k.
std::vector<size_t> code_point_offsets(std::string_view s);

// str.isspace() for one code point (Unicode White_Space as CPython defines it).
bool py_isspace(char32_t cp);
// str.isprintable() for one code point, as repr() uses it. Unassigned code points count as printable here (CPython
// escapes them); every assigned non-printable class (Cc, Cf, Co, Cs, Zl, Zp, Zs other than ' ') is escaped.
bool py_isprintable(char32_t cp);

enum class StripSide { kLeft, kRight, kBoth };
// str.strip() / lstrip() / rstrip() with no argument.
std::string_view py_strip(std::string_view s, StripSide side);
// The same with an explicit set of characters (every code point of `chars`).
std::string_view py_strip_chars(std::string_view s, std::string_view chars, StripSide side);
// str.split(sep, maxsplit) for a non-empty sep; maxsplit < 0: no limit.
std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit);
// str.split(None, maxsplit): runs of whitespace separate, no empty pieces.
std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit);
// str.replace(old, new, count); count < 0: all. An empty `old` inserts `rep` around every code point.
std::string py_replace(std::string_view s, std::string_view old, std::string_view rep, int64_t count);
// The length py_replace's result would have (to refuse a huge one before building it).
uint64_t py_replace_size(std::string_view s, std::string_view old, std::string_view rep, int64_t count);
// str.find(sub): the code-point index of the first occurrence, or -1.
int64_t py_find(std::string_view s, std::string_view sub);
// str.count(sub): non-overlapping occurrences (code points + 1 for an empty sub).
int64_t py_count(std::string_view s, std::string_view sub);

// repr() of a str: '...' (or "..." when the text has ' and no "), with \\ \n \r \t \xhh \uhhhh escapes.
std::string py_repr_string(std::string_view s);
// repr() / str() of a float: "1.5", "1e+16", "1e-05", "inf", "nan", "-0.0".
std::string py_float_repr(double v);

// ASCII-only case mapping; false when s holds a non-ASCII letter whose mapping Python would change (so callers can
// refuse instead of answering differently).
bool ascii_case_map(std::string_view s, bool upper, std::string& out);

}  // namespace kestrel::chat::jinja
