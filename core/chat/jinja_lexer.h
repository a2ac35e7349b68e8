// Lexer of the Jinja interpreter (core/chat): template source -> tokens, as jinja2's lexer does with the settings
// Hugging Face transformers renders chat templates with (trim_blocks=True, lstrip_blocks=True, default delimiters,
// keep_trailing_newline=False).
//
// What it reproduces: newlines normalised to "\n" and one trailing newline dropped; text between tags as kData;
// `{{ }}`, `{% %}` and `{# #}` (comments are dropped); whitespace control: `{%-`/`{{-`/`{#-` strip all whitespace
// before the tag, `-%}`/`-}}`/`-#}` all whitespace after it; trim_blocks removes the first newline after `%}` and
// `#}`; lstrip_blocks removes spaces and tabs between the start of a line and `{%` / `{#` (not `{{`), `{%+` opts out,
// `+%}` keeps the newline; inside tags: names, strings (with Python's escapes), integers (decimal, 0x, 0o, 0b, `_`
// separators), floats and operators, with bracket balancing (a `}}` inside `{...}` does not end the tag).
// `{% raw %}` is refused (kUnsupported); malformed input is kInvalidArgument naming the line.
// Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::chat::jinja {

enum class TokenType : uint8_t {
  kData,           // template text (value)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifier or keyword (value)
  kString,         // string literal, unescaped (value)
  kInteger,        // int_value
  kFloat,          // float_value
  kOperator,       // value: + - * / // % ** ~ == != < <= > >= = . : | , ; ( ) [ ] { }
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  int line = 1;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0;
};

Expected<std::vector<Token>> lex_template(std::string_view source);

// "'end of statement block'", "name 'endif'", "'+'", ... for error messages.
std::string describe_token(const Token& t);

}  // namespace kestrel::chat::jinja
