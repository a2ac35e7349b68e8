// Argument binding for the interpreter's builtins (core/chat): Python's rules for positional and keyword
// arguments against a fixed parameter list (too many, unknown, duplicate and missing arguments are TypeErrors).
#pragma once

#include <initializer_list>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/chat/jinja_value.h"

namespace kestrel::chat::jinja {

struct Param {
  const char* name;
  bool required = false;
  Value default_value = Value::none();
};

// The arguments of `fn` in parameter order (defaults filled in).
Expected<std::vector<Value>> bind_args(std::string_view fn, CallArgs args, std::initializer_list<Param> params);

}  // namespace kestrel::chat::jinja
