// Methods of Python objects that chat templates call (core/chat): str (startswith, endswith, split, rsplit, strip,
// lstrip, rstrip, replace, upper, lower, capitalize, find, count, join, splitlines, removeprefix, removesuffix),
// dict (get, items, keys, values) and loop.cycle, plus the global functions namespace(), range(), dict() and
// raise_exception(). Methods Python has but this interpreter does not implement are found (so `x.method is defined`
// answers as in Python) and fail with kUnsupported when called; methods that mutate a list or dict are unsafe in
// transformers' ImmutableSandboxedEnvironment and come back as an Undefined that fails when used, as there.
#pragma once

#include <optional>
#include <string_view>

#include "core/chat/jinja_value.h"

namespace kestrel::chat::jinja {

// obj.name when obj's Python type has a method of that name.
std::optional<Value> find_method(const Value& obj, std::string_view name);

// The builtin global of that name (namespace, range, dict, raise_exception), or nullopt.
std::optional<Value> find_global_function(std::string_view name);

// splitlines() of a str: line breaks \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029, no ends kept.
std::vector<std::string> py_splitlines(std::string_view s);

}  // namespace kestrel::chat::jinja
