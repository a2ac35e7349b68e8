// Operators and object access of the Jinja interpreter (core/chat), with Python's results and errors:
// arithmetic (+ - * / // % ** and unary - +, with str / list concatenation and repetition and markupsafe's escaping
// when a |safe string meets a plain one), attribute access and subscripts as jinja2's ImmutableSandboxedEnvironment
// does them (a dict's keys by attribute, its methods first; missing things are Undefined; mutating methods are
// unsafe Undefined), and slicing. Errors carry no line; the evaluator adds it.
#pragma once

#include <string_view>

#include "core/base/expected.h"
#include "core/chat/jinja_ast.h"
#include "core/chat/jinja_value.h"

namespace kestrel::chat::jinja {

Expected<Value> binary_op(BinaryOp op, const Value& a, const Value& b, size_t max_bytes);
Expected<Value> unary_minus(const Value& v);
Expected<Value> unary_plus(const Value& v);

// obj.name
Expected<Value> get_attr(const Value& obj, std::string_view name);
// obj[key]
Expected<Value> get_item(const Value& obj, const Value& key);
// obj[start:stop:step]; each bound may be None.
Expected<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// markupsafe.escape() of a plain string: & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

}  // namespace kestrel::chat::jinja
