// Tests (`x is name`) of the Jinja interpreter with jinja2 3.1's behaviour (jinja_builtins.h).
#include <algorithm>
#include <array>

#include "core/chat/jinja_args.h"
#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_ops.h"
#include "core/chat/jinja_text.h"

namespace kestrel::chat::jinja {

namespace {

constexpr std::array<std::string_view, 36> kSupportedTests = {
    "boolean", "callable",  "defined",     "divisibleby", "eq",      "equalto",  "even",   "false",    "float",
    "ge",      "gt",        "greaterthan", "in",          "integer", "iterable", "le",     "lessthan", "lower",
    "lt",      "mapping",   "ne",          "none",        "number",  "odd",      "sameas", "sequence", "string",
    "true",    "undefined", "upper",       "==",          "!=",      "<",        "<=",     ">",        ">="};
constexpr std::array<std::string_view, 3> kOtherJinjaTests = {"escaped", "filter", "test"};

template <size_t N>
bool listed(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool is_sequence(const Value& v) {
  // jinja2: len(value) and value.__getitem__ both exist (str, list, tuple, dict, and Undefined).
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kString:
    case Value::Kind::kDict: return true;
    case Value::Kind::kList: return v.list().kind == SeqKind::kList || v.list().kind == SeqKind::kTuple;
    default: return false;
  }
}

bool is_iterable(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kString:
    case Value::Kind::kList:
    case Value::Kind::kDict:
    case Value::Kind::kLoop: return true;
    default: return false;
  }
}

// str.islower() / isupper() for ASCII text; kUnsupported when a non-ASCII cased letter decides it.
Expected<bool> case_test(const Value& v, bool lower) {
  KESTREL_TRY_ASSIGN(std::string s, py_str(v));
  std::string mapped;
  if (!ascii_case_map(s, !lower, mapped)) return unsupported("the lower / upper test on non-ASCII letters");
  bool cased = false;
  for (const char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) cased = true;
    if (lower && c >= 'A' && c <= 'Z') return false;
    if (!lower && c >= 'a' && c <= 'z') return false;
  }
  return cased;
}

Expected<bool> compare(std::string_view name, const Value& v, const Value& other) {
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, other);
  if (name == "ne" || name == "!=") return !py_equal(v, other);
  const Order op = (name == "lt" || name == "lessthan" || name == "<")      ? Order::kLt
                   : (name == "le" || name == "<=")                         ? Order::kLe
                   : (name == "gt" || name == "greaterthan" || name == ">") ? Order::kGt
                                                                            : Order::kGe;
  return py_order(v, other, op);
}

Expected<bool> modulo_zero(const Value& v, const Value& divisor) {
  KESTREL_TRY_ASSIGN(Value r, binary_op(BinaryOp::kMod, v, divisor, 0));
  return py_equal(r, Value::integer(0));
}

}  // namespace

bool is_supported_test(std::string_view name) { return listed(kSupportedTests, name); }
bool is_known_test(std::string_view name) { return listed(kSupportedTests, name) || listed(kOtherJinjaTests, name); }

bool is_unsupported_global(std::string_view name) {
  return name == "strftime_now" || name == "cycler" || name == "joiner" || name == "lipsum";
}

Expected<bool> apply_test(Evaluator& /*ev*/, std::string_view name, const Value& v, CallArgs args) {
  const std::string fn = "the test " + std::string(name);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == Value::Kind::kDict;
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  // Undefined and the loop object define __call__ in jinja2, so callable() is true for them too.
  if (name == "callable") {
    return v.kind() == Value::Kind::kCallable || v.kind() == Value::Kind::kUndefined || v.kind() == Value::Kind::kLoop;
  }
  if (name == "sequence") return is_sequence(v);
  if (name == "iterable") return is_iterable(v);
  if (name == "lower" || name == "upper") return case_test(v, name == "lower");
  if (name == "odd" || name == "even") {
    KESTREL_TRY_ASSIGN(Value r, binary_op(BinaryOp::kMod, v, Value::integer(2), 0));
    return py_equal(r, Value::integer(name == "odd" ? 1 : 0));
  }
  KESTREL_TRY_ASSIGN(auto a, bind_args(fn, std::move(args), {{"other", true}}));
  if (name == "divisibleby") return modulo_zero(v, a[0]);
  if (name == "in") return py_contains(a[0], v);
  if (name == "sameas") {
    // `is`: the same object. None, True and False are singletons; containers compare by identity of their data.
    if (v.kind() != a[0].kind()) return false;
    switch (v.kind()) {
      case Value::Kind::kNone: return true;
      case Value::Kind::kBool: return v.as_bool() == a[0].as_bool();
      case Value::Kind::kList: return &v.list() == &a[0].list();
      case Value::Kind::kDict: return &v.dict() == &a[0].dict();
      case Value::Kind::kNamespace:
      case Value::Kind::kCallable:
      case Value::Kind::kLoop: return py_equal(v, a[0]);
      default:
        return unsupported("the sameas test on " + type_name(v) + " values (Python's answer depends on caching)");
    }
  }
  return compare(name, v, a[0]);
}

}  // namespace kestrel::chat::jinja
