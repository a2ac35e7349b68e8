// Jinja lexer with transformers' settings (jinja_lexer.h).
#include "core/chat/jinja_lexer.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "core/chat/jinja_text.h"

namespace kestrel::chat::jinja {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Error syntax_error(int line, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "template syntax error at line " + std::to_string(line) + ": " + what);
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  Expected<std::vector<Token>> run() {
    while (pos_ < s_.size()) {
      const size_t tag = find_tag_start();
      if (tag == std::string::npos) {
        emit_data(std::string_view(s_).substr(pos_));
        break;
      }
      const char kind = s_[tag + 1];
      const char sign = (tag + 2 < s_.size() && (s_[tag + 2] == '-' || s_[tag + 2] == '+')) ? s_[tag + 2] : '\0';
      std::string_view text = std::string_view(s_).substr(pos_, tag - pos_);
      const int text_newlines = count_newlines(text);
      if (sign == '-') {
        text = py_strip(text, StripSide::kRight);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between the line start and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && text.find_first_not_of(" \t", l_pos) == std::string_view::npos) {
          text = text.substr(0, l_pos);
        }
      }
      if (!text.empty()) push(TokenType::kData, std::string(text));
      line_ += text_newlines;
      pos_ = tag + 2 + (sign != '\0' ? 1 : 0);
      if (kind == '#') {
        KESTREL_TRY(lex_comment());
      } else {
        KESTREL_TRY(lex_tag(kind));
      }
    }
    push(TokenType::kEof, std::string());
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start() const {
    for (size_t i = pos_; i + 1 < s_.size(); ++i) {
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  static int count_newlines(std::string_view t) {
    int n = 0;
    for (const char c : t) n += c == '\n' ? 1 : 0;
    return n;
  }

  void emit_data(std::string_view text) {
    if (!text.empty()) push(TokenType::kData, std::string(text));
    line_ += count_newlines(text);
  }

  Token& push(TokenType type, std::string value) {
    Token t;
    t.type = type;
    t.line = line_;
    t.value = std::move(value);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  bool starts_with(std::string_view what) const { return std::string_view(s_).substr(pos_).starts_with(what); }

  // Skips whitespace (str.isspace), counting newlines.
  void skip_space() {
    while (pos_ < s_.size()) {
      size_t j = pos_;
      const char32_t cp = next_code_point(s_, j);
      if (!py_isspace(cp)) break;
      if (cp == '\n') ++line_;
      pos_ = j;
    }
  }

  Status lex_comment() {
    const int start_line = line_;
    const size_t q = s_.find("#}", pos_);
    if (q == std::string::npos) return syntax_error(start_line, "missing end of comment tag");
    line_ += count_newlines(std::string_view(s_).substr(pos_, q - pos_));
    const char before = q > pos_ ? s_[q - 1] : '\0';
    pos_ = q + 2;
    if (before == '-') {
      skip_space();
    } else if (before != '+' && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;  // trim_blocks
      ++line_;
    }
    line_starting_ = s_[pos_ - 1] == '\n';
    return ok_status();
  }

  Status lex_tag(char kind) {
    const int begin_line = line_;
    if (kind == '%') {
      // {% raw %}: jinja2 copies the text up to {% endraw %} verbatim; not implemented here.
      size_t p = pos_;
      while (p < s_.size() && py_isspace(static_cast<unsigned char>(s_[p]))) ++p;
      if (std::string_view(s_).substr(p).starts_with("raw") && (p + 3 >= s_.size() || !is_name_char(s_[p + 3]))) {
        return make_error(ErrorCode::kUnsupported,
                          "the {% raw %} tag (line " + std::to_string(begin_line) + ") is not supported");
      }
    }
    push(kind == '{' ? TokenType::kVariableBegin : TokenType::kBlockBegin, std::string());
    std::vector<char> balance;
    for (;;) {
      if (pos_ >= s_.size()) {
        return syntax_error(begin_line,
                            std::string("unexpected end of template, expected '") + (kind == '{' ? "}}" : "%}") + "'");
      }
      if (balance.empty() && end_tag(kind)) return ok_status();
      const char c = s_[pos_];
      if (py_isspace(static_cast<unsigned char>(c)) || static_cast<unsigned char>(c) >= 0x80) {
        size_t j = pos_;
        const char32_t cp = next_code_point(s_, j);
        if (!py_isspace(cp)) return syntax_error(line_, "unexpected character in tag");
        skip_space();
        continue;
      }
      if (is_digit(c)) {
        KESTREL_TRY(lex_number());
        continue;
      }
      if (is_name_start(c)) {
        const size_t start = pos_;
        while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
        push(TokenType::kName, s_.substr(start, pos_ - start));
        continue;
      }
      if (c == '\'' || c == '"') {
        KESTREL_TRY(lex_string(c));
        continue;
      }
      KESTREL_TRY(lex_operator(balance));
    }
  }

  // The end of a {{ }} or {% %} tag at pos_ (outside brackets): emits it and applies whitespace control.
  bool end_tag(char kind) {
    const int line = line_;
    if (kind == '{') {
      if (starts_with("-}}")) {
        pos_ += 3;
        skip_space();
      } else if (starts_with("}}")) {
        pos_ += 2;
      } else {
        return false;
      }
    } else {
      if (starts_with("+%}")) {
        pos_ += 3;
      } else if (starts_with("-%}")) {
        pos_ += 3;
        skip_space();
      } else if (starts_with("%}")) {
        pos_ += 2;
        if (pos_ < s_.size() && s_[pos_] == '\n') {  // trim_blocks
          ++pos_;
          ++line_;
        }
      } else {
        return false;
      }
    }
    tokens_.push_back(Token{kind == '{' ? TokenType::kVariableEnd : TokenType::kBlockEnd, line, {}, 0, 0});
    line_starting_ = s_[pos_ - 1] == '\n';
    return true;
  }

  // `(\d+_)*\d+` at p: returns the end, or p when there is no digit.
  size_t scan_digits(size_t p) const {
    size_t q = p;
    while (q < s_.size() && is_digit(s_[q])) {
      while (q < s_.size() && is_digit(s_[q])) ++q;
      if (q + 1 < s_.size() && s_[q] == '_' && is_digit(s_[q + 1])) ++q;
    }
    return q;
  }

  static std::string without_underscores(std::string_view t) {
    std::string out;
    for (const char c : t) {
      if (c != '_') out += c;
    }
    return out;
  }

  Status lex_number() {
    const size_t start = pos_;
    // Float: (?<!\.)digits((\.digits)?[eE][+-]?digits | \.digits)
    if (start == 0 || s_[start - 1] != '.') {
      const size_t int_end = scan_digits(start);
      size_t end = 0;
      size_t p = int_end;
      if (p + 1 < s_.size() && s_[p] == '.' && is_digit(s_[p + 1])) p = scan_digits(p + 1);
      if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
        size_t q = p + 1;
        if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
        const size_t exp_end = scan_digits(q);
        if (exp_end > q) end = exp_end;
      }
      if (end == 0 && int_end + 1 < s_.size() && s_[int_end] == '.' && is_digit(s_[int_end + 1])) {
        end = scan_digits(int_end + 1);
      }
      if (end != 0) {
        const std::string text = without_underscores(std::string_view(s_).substr(start, end - start));
        double v = 0;
        const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
        if (res.ec != std::errc() && res.ec != std::errc::result_out_of_range) {
          return syntax_error(line_, "bad float literal " + text);
        }
        if (res.ec == std::errc::result_out_of_range) v = std::strtod(text.c_str(), nullptr);  // inf or 0, as Python
        pos_ = end;
        Token& t = push(TokenType::kFloat, text);
        t.float_value = v;
        return ok_status();
      }
    }
    // Integer: 0b.., 0o.., 0x.. (with _ separators), [1-9](_?\d)*, 0(_?0)*
    int base = 10;
    size_t p = start;
    if (s_[p] == '0' && p + 1 < s_.size()) {
      const char x = s_[p + 1];
      if (x == 'b' || x == 'B') base = 2;
      if (x == 'o' || x == 'O') base = 8;
      if (x == 'x' || x == 'X') base = 16;
    }
    std::string digits;
    if (base != 10) {
      size_t q = p + 2;
      for (;;) {
        size_t r = q;
        if (r < s_.size() && s_[r] == '_') ++r;
        if (r >= s_.size()) break;
        const int d = hex_value(s_[r]);
        if (d < 0 || d >= base) break;
        digits += s_[r];
        q = r + 1;
      }
      if (digits.empty()) {
        base = 10;  // a lone 0 followed by a letter
      } else {
        p = q;
      }
    }
    if (base == 10) {
      const bool zero = s_[p] == '0';
      size_t q = p + 1;
      digits = s_[p];
      for (;;) {
        size_t r = q;
        if (r < s_.size() && s_[r] == '_') ++r;
        if (r >= s_.size() || !is_digit(s_[r]) || (zero && s_[r] != '0')) break;
        digits += s_[r];
        q = r + 1;
      }
      p = q;
    }
    int64_t v = 0;
    const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (res.ec != std::errc()) {
      return make_error(ErrorCode::kUnsupported,
                        "integer literal at line " + std::to_string(line_) + " does not fit 64 bits");
    }
    Token& t = push(TokenType::kInteger, s_.substr(start, p - start));
    t.int_value = v;
    pos_ = p;
    return ok_status();
  }

  // A quoted string; its value after Python's unicode-escape decoding (as jinja2 does).
  Status lex_string(char quote) {
    const int start_line = line_;
    size_t p = pos_ + 1;
    std::string value;
    for (;;) {
      if (p >= s_.size()) return syntax_error(start_line, std::string("unexpected char '") + quote + "'");
      const char c = s_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= s_.size()) return syntax_error(start_line, std::string("unexpected char '") + quote + "'");
      KESTREL_TRY(unescape(p, value, start_line));
    }
    pos_ = p + 1;
    push(TokenType::kString, std::move(value));
    return ok_status();
  }

  // One backslash escape at s_[p] ('\\'); appends its value and advances p.
  Status unescape(size_t& p, std::string& value, int line) {
    const char e = s_[p + 1];
    auto read_hex = [&](size_t at, int n, char32_t& cp) {
      cp = 0;
      for (int k = 0; k < n; ++k) {
        if (at + k >= s_.size() || hex_value(s_[at + k]) < 0) return false;
        cp = cp * 16 + static_cast<char32_t>(hex_value(s_[at + k]));
      }
      return true;
    };
    char32_t cp = 0;
    switch (e) {
      case '\\':
        value += '\\';
        p += 2;
        return ok_status();
      case '\'':
        value += '\'';
        p += 2;
        return ok_status();
      case '"':
        value += '"';
        p += 2;
        return ok_status();
      case 'a':
        value += '\a';
        p += 2;
        return ok_status();
      case 'b':
        value += '\b';
        p += 2;
        return ok_status();
      case 'f':
        value += '\f';
        p += 2;
        return ok_status();
      case 'n':
        value += '\n';
        p += 2;
        return ok_status();
      case 'r':
        value += '\r';
        p += 2;
        return ok_status();
      case 't':
        value += '\t';
        p += 2;
        return ok_status();
      case 'v':
        value += '\v';
        p += 2;
        return ok_status();
      case '\n':
        ++line_;
        p += 2;
        return ok_status();  // line continuation
      case 'x':
        if (!read_hex(p + 2, 2, cp)) return syntax_error(line, "truncated \\xXX escape in a string");
        append_utf8(value, cp);
        p += 4;
        return ok_status();
      case 'u':
      case 'U': {
        const int n = e == 'u' ? 4 : 8;
        if (!read_hex(p + 2, n, cp)) return syntax_error(line, std::string("truncated \\") + e + " escape in a string");
        if (cp > 0x10FFFF) return syntax_error(line, "illegal Unicode character in a string escape");
        if (cp >= 0xD800 && cp <= 0xDFFF) {
          return make_error(ErrorCode::kUnsupported,
                            "a surrogate escape in a string (line " + std::to_string(line) + ") is not supported");
        }
        append_utf8(value, cp);
        p += 2 + static_cast<size_t>(n);
        return ok_status();
      }
      case 'N':
        return make_error(ErrorCode::kUnsupported,
                          "\\N{...} escapes in strings (line " + std::to_string(line) + ") are not supported");
      default: break;
    }
    if (e >= '0' && e <= '7') {
      size_t q = p + 1;
      while (q < s_.size() && q < p + 4 && s_[q] >= '0' && s_[q] <= '7')
        cp = cp * 8 + static_cast<char32_t>(s_[q++] - '0');
      append_utf8(value, cp);
      p = q;
      return ok_status();
    }
    // An unknown escape keeps its backslash. jinja2 first turns a non-ASCII character into its \x / \u / \U
    // escape text (encode("ascii", "backslashreplace")), so "\é" decodes to the four characters "\xe9".
    value += '\\';
    if (static_cast<unsigned char>(e) >= 0x80) {
      size_t j = p + 1;
      const char32_t c = next_code_point(s_, j);
      char buf[16];
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      }
      value += buf;
      p = j;
      return ok_status();
    }
    value += e;
    p += 2;
    return ok_status();
  }

  Status lex_operator(std::vector<char>& balance) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const std::string_view op : kTwo) {
      if (starts_with(op)) {
        push(TokenType::kOperator, std::string(op));
        pos_ += 2;
        return ok_status();
      }
    }
    const char c = s_[pos_];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      return syntax_error(line_, std::string("unexpected char '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) return syntax_error(line_, std::string("unexpected '") + c + "'");
      if (balance.back() != c) {
        return syntax_error(line_, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      }
      balance.pop_back();
    }
    push(TokenType::kOperator, std::string(1, c));
    ++pos_;
    return ok_status();
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

Expected<std::vector<Token>> lex_template(std::string_view source) {
  if (!valid_utf8(source)) return make_error(ErrorCode::kInvalidArgument, "the template is not valid UTF-8");
  // jinja2 splits the source into lines on \r\n, \r and \n, joins them with \n and drops one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

std::string describe_token(const Token& t) {
  switch (t.type) {
    case TokenType::kData: return "template data";
    case TokenType::kVariableBegin: return "'{{'";
    case TokenType::kVariableEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "'{%'";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kName: return "'" + t.value + "'";
    case TokenType::kString: return "string";
    case TokenType::kInteger:
    case TokenType::kFloat: return "number " + t.value;
    case TokenType::kOperator: return "'" + t.value + "'";
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

}  // namespace kestrel::chat::jinja
