// Parser of the Jinja interpreter (core/chat): tokens -> Program, with jinja2's grammar and precedence.
//
// Statements: if / elif / else, for (tuple targets, `else`, an `if` filter), set (`x = ...`, `a, b = ...`,
// `ns.attr = ...`, block form with filters), macro (parameters with defaults), filter blocks, break / continue
// (jinja2.ext.loopcontrols, which transformers enables) and transformers' {% generation %}. Expressions: literals,
// lists, tuples, dicts, names, attribute and subscript access, slices, calls, filters, tests, unary and binary
// arithmetic, `~`, comparisons (chained, `in`, `not in`), and / or / not, conditional expressions.
//
// Refused at parse time (kUnsupported, naming the construct and line) rather than mis-rendered later: tags the
// interpreter does not implement (extends, block, include, import, from, call, with, autoescape, raw, ...), filters
// and tests it does not implement, recursive loops, `*args` / `**kwargs` in calls, macros that use varargs, kwargs
// or caller, and calls to globals it does not provide (strftime_now, cycler, joiner, lipsum). Syntax errors are
// kInvalidArgument with the line. Pure function; thread-safe.
#pragma once

#include <string_view>

#include "core/base/expected.h"
#include "core/chat/jinja_ast.h"

namespace kestrel::chat::jinja {

Expected<Program> parse_program(std::string_view source);

}  // namespace kestrel::chat::jinja
