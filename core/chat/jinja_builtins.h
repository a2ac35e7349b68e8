// The filters, tests and global functions the Jinja interpreter provides (core/chat), with jinja2 3.1's behaviour
// and transformers' overrides (tojson as json.dumps with ensure_ascii=False; raise_exception).
//
// Filters: abs, capitalize, count, d, default, first, float, indent, int, items, join, last, length, list, lower, map,
// reject, rejectattr, replace, reverse, safe, select, selectattr, string, tojson, trim, upper.
// Tests: boolean, callable, defined, divisibleby, eq, equalto, even, false, float, ge, gt, greaterthan, in, integer,
// iterable, le, lessthan, lower, lt, mapping, ne, none, number, odd, sameas, sequence, string, true, undefined,
// upper, ==, !=, <, <=, >, >=.
// Globals (jinja_methods.h): namespace, range, dict, raise_exception.
// Anything else jinja2 has is refused when the template is parsed (is_known_* tells the parser which names jinja2
// itself would accept, so a misspelt name is a syntax error and a real but missing one is kUnsupported).
#pragma once

#include <string_view>

#include "core/base/expected.h"
#include "core/chat/jinja_value.h"

namespace kestrel::chat::jinja {

bool is_supported_filter(std::string_view name);
bool is_known_filter(std::string_view name);  // jinja2's builtin filters (and transformers' tojson)
bool is_supported_test(std::string_view name);
bool is_known_test(std::string_view name);
// Globals jinja2 or transformers provide that are not implemented here (calls to them are refused at parse).
bool is_unsupported_global(std::string_view name);

Expected<Value> apply_filter(Evaluator& ev, std::string_view name, const Value& subject, CallArgs args);
Expected<bool> apply_test(Evaluator& ev, std::string_view name, const Value& subject, CallArgs args);

}  // namespace kestrel::chat::jinja
