// Filters of the Jinja interpreter with jinja2 3.1's behaviour (jinja_builtins.h).
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/chat/jinja_args.h"
#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_eval.h"
#include "core/chat/jinja_json.h"
#include "core/chat/jinja_methods.h"
#include "core/chat/jinja_ops.h"
#include "core/chat/jinja_text.h"

namespace kestrel::chat::jinja {

namespace {

constexpr std::array<std::string_view, 27> kSupportedFilters = {
    "abs",     "capitalize", "count", "d",      "default",    "first",  "float",  "indent", "int",
    "items",   "join",       "last",  "length", "list",       "lower",  "map",    "reject", "rejectattr",
    "replace", "reverse",    "safe",  "select", "selectattr", "string", "tojson", "trim",   "upper"};
constexpr std::array<std::string_view, 27> kOtherJinjaFilters = {
    "attr",    "batch", "center",   "dictsort", "e",         "escape", "filesizeformat", "forceescape", "format",
    "groupby", "max",   "min",      "pprint",   "random",    "round",  "slice",          "sort",        "striptags",
    "sum",     "title", "truncate", "unique",   "urlencode", "urlize", "wordcount",      "wordwrap",    "xmlattr"};

template <size_t N>
bool listed(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// jinja2's soft_str: a str (Markup included) stays itself; anything else becomes str(value).
Expected<Value> soft_str(const Value& v) {
  if (v.is_string()) return v;
  KESTREL_TRY_ASSIGN(std::string s, py_str(v));
  return Value::string(std::move(s));
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then index 0 (parts of digits are integers).
Expected<Value> get_attribute_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value subject = item;
  for (const std::string& part : py_split(attribute.str(), ".", -1)) {
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    int64_t index = 0;
    if (digits && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc()) {
      KESTREL_TRY_ASSIGN(subject, get_item(subject, Value::integer(index)));
    } else {
      KESTREL_TRY_ASSIGN(subject, get_item(subject, Value::string(part)));
    }
  }
  return subject;
}

Expected<Value> filter_tojson(const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(auto a, bind_args("tojson", std::move(args),
                                       {{"ensure_ascii", false, Value::boolean(false)},
                                        {"indent"},
                                        {"separators"},
                                        {"sort_keys", false, Value::boolean(false)}}));
  JsonDumpOptions o;
  o.ensure_ascii = truthy(a[0]);
  if (a[1].is_string()) {
    o.indent = a[1].str();
  } else if (a[1].kind() == Value::Kind::kInt || a[1].kind() == Value::Kind::kBool) {
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(a[1].as_int(), 4096))), ' ');
  } else if (!a[1].is_none()) {
    return type_error("can't multiply sequence by non-int of type '" + type_name(a[1]) + "'");
  }
  if (!a[2].is_none()) {
    KESTREL_TRY_ASSIGN(std::vector<Value> seps, py_iterate(a[2]));
    if (seps.size() != 2) return type_error("separators must be a pair of strings");
    if (!seps[0].is_string() || !seps[1].is_string()) return type_error("separators must be strings");
    o.item_separator = seps[0].str();
    o.key_separator = seps[1].str();
  }
  o.sort_keys = truthy(a[3]);
  KESTREL_TRY_ASSIGN(std::string s, json_dumps(v, o));
  return Value::string(std::move(s));
}

Expected<Value> filter_trim(const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(auto a, bind_args("trim", std::move(args), {{"chars"}}));
  KESTREL_TRY_ASSIGN(Value s, soft_str(v));
  if (a[0].is_none()) return Value::string(std::string(py_strip(s.str(), StripSide::kBoth)), s.markup());
  if (!a[0].is_string()) return type_error("strip arg must be None or str");
  if (s.markup()) return unsupported("trim(chars) of a |safe (Markup) value");
  return Value::string(std::string(py_strip_chars(s.str(), a[0].str(), StripSide::kBoth)));
}

// Python int(str): surrounding whitespace, a sign, digits with single underscores between them.
std::optional<int64_t> parse_py_int(std::string_view raw, bool& overflow) {
  const std::string_view t = py_strip(raw, StripSide::kBoth);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  std::string digits;
  for (; i < t.size(); ++i) {
    if (t[i] >= '0' && t[i] <= '9') {
      digits += t[i];
    } else if (!(t[i] == '_' && !digits.empty() && i + 1 < t.size() && t[i + 1] >= '0' && t[i + 1] <= '9')) {
      return std::nullopt;
    }
  }
  if (digits.empty()) return std::nullopt;
  if (neg) digits.insert(digits.begin(), '-');
  int64_t r = 0;
  const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), r);
  overflow = res.ec != std::errc();
  return r;
}

std::optional<double> parse_py_float(std::string_view raw);

// int(x): jinja2 tries int(value) (int(value, base) for a str), then int(float(value)), then the default.
Expected<Value> filter_int(const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(auto a, bind_args("int", std::move(args),
                                       {{"default", false, Value::integer(0)}, {"base", false, Value::integer(10)}}));
  auto from_float = [&](double d) -> Expected<Value> {
    if (std::isnan(d)) return a[0];  // ValueError: the default
    if (std::isinf(d)) return type_error("cannot convert float infinity to integer");
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) return unsupported("int() beyond 64 bits");
    return Value::integer(static_cast<int64_t>(d));
  };
  switch (v.kind()) {
    case Value::Kind::kBool:
    case Value::Kind::kInt: return Value::integer(v.as_int());
    case Value::Kind::kFloat: return from_float(v.as_float());
    case Value::Kind::kString: {
      if (!(a[1].kind() == Value::Kind::kInt && a[1].as_int() == 10)) return unsupported("int(base=...) other than 10");
      bool overflow = false;
      if (auto i = parse_py_int(v.str(), overflow)) {
        if (overflow) return unsupported("int() beyond 64 bits");
        return Value::integer(*i);
      }
      if (auto d = parse_py_float(v.str())) return from_float(*d);
      return a[0];
    }
    default: return a[0];
  }
}

// Python float(str): surrounding whitespace, digits with single underscores, inf / nan spellings.
std::optional<double> parse_py_float(std::string_view raw) {
  std::string t(py_strip(raw, StripSide::kBoth));
  std::string lower;
  for (const char c : t) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  const std::string_view body =
      std::string_view(lower).substr(lower.starts_with('+') || lower.starts_with('-') ? 1 : 0);
  const bool neg = lower.starts_with('-');
  if (body == "inf" || body == "infinity") return neg ? -INFINITY : INFINITY;
  if (body == "nan") return NAN;
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_') {
      const bool digit_before = i > 0 && t[i - 1] >= '0' && t[i - 1] <= '9';
      const bool digit_after = i + 1 < t.size() && t[i + 1] >= '0' && t[i + 1] <= '9';
      if (!digit_before || !digit_after) return std::nullopt;
      continue;
    }
    clean += t[i];
  }
  if (clean.empty()) return std::nullopt;
  const char* b = clean.data();
  if (*b == '+') ++b;
  double d = 0;
  const auto res = std::from_chars(b, clean.data() + clean.size(), d);
  if (res.ptr != clean.data() + clean.size() || (res.ec != std::errc() && res.ec != std::errc::result_out_of_range)) {
    return std::nullopt;
  }
  // Out of range: from_chars leaves d alone; strtod gives Python's result (+-inf, or +-0 for underflow).
  if (res.ec == std::errc::result_out_of_range) d = std::strtod(clean.c_str(), nullptr);
  return d;
}

Expected<Value> filter_float(const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(auto a, bind_args("float", std::move(args), {{"default", false, Value::number(0.0)}}));
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string()) {
    if (auto d = parse_py_float(v.str())) return Value::number(*d);
  }
  return a[0];
}

Expected<Value> filter_join(Evaluator& ev, const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(auto a, bind_args("join", std::move(args), {{"d", false, Value::string("")}, {"attribute"}}));
  KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(v));
  KESTREL_TRY_ASSIGN(std::string sep, py_str(a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (!a[1].is_none()) {
      KESTREL_TRY_ASSIGN(item, get_attribute_path(item, a[1]));
    }
    KESTREL_TRY_ASSIGN(std::string s, py_str(item));
    if (i > 0) out += sep;
    out += s;
    KESTREL_TRY(ev.check_size(out.size()));
  }
  return Value::string(std::move(out));
}

Expected<Value> filter_case(std::string_view name, const Value& v, CallArgs args) {
  KESTREL_TRY(bind_args(name, std::move(args), {}));
  KESTREL_TRY_ASSIGN(Value s, soft_str(v));
  const std::string& t = s.str();
  std::string out;
  if (name == "capitalize") {
    size_t cut = 0;
    if (!t.empty()) next_code_point(t, cut);
    std::string first, rest;
    if (!ascii_case_map(std::string_view(t).substr(0, cut), true, first) ||
        !ascii_case_map(std::string_view(t).substr(cut), false, rest)) {
      return unsupported("capitalize of text with non-ASCII letters");
    }
    return Value::string(first + rest, s.markup());
  }
  if (!ascii_case_map(t, name == "upper", out))
    return unsupported(std::string(name) + " of text with non-ASCII letters");
  return Value::string(std::move(out), s.markup());
}

Expected<Value> filter_replace(const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(auto a, bind_args("replace", std::move(args), {{"old", true}, {"new", true}, {"count"}}));
  KESTREL_TRY_ASSIGN(std::string s, py_str(v));
  KESTREL_TRY_ASSIGN(std::string old, py_str(a[0]));
  KESTREL_TRY_ASSIGN(std::string rep, py_str(a[1]));
  int64_t count = -1;
  if (!a[2].is_none()) {
    if (a[2].kind() != Value::Kind::kInt && a[2].kind() != Value::Kind::kBool) {
      return type_error("'" + type_name(a[2]) + "' object cannot be interpreted as an integer");
    }
    count = a[2].as_int();
  }
  if (py_replace_size(s, old, rep, count) > kMaxStringBytes) {
    return make_error(ErrorCode::kResourceExhausted, "replace result past 256 MiB");
  }
  return Value::string(py_replace(s, old, rep, count));
}

Expected<Value> filter_indent(const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(auto a, bind_args("indent", std::move(args),
                                       {{"width", false, Value::integer(4)},
                                        {"first", false, Value::boolean(false)},
                                        {"blank", false, Value::boolean(false)}}));
  if (!v.is_string()) return type_error("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  if (v.markup()) return unsupported("indent of a |safe (Markup) value");
  std::string indention;
  if (a[0].is_string()) {
    indention = a[0].str();
  } else if (a[0].kind() == Value::Kind::kInt || a[0].kind() == Value::Kind::kBool) {
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(a[0].as_int(), 4096))), ' ');
  } else {
    return type_error("can't multiply sequence by non-int of type '" + type_name(a[0]) + "'");
  }
  const std::vector<std::string> lines = py_splitlines(v.str() + "\n");
  if (v.str().size() + lines.size() * (indention.size() + 1) > kMaxStringBytes) {
    return make_error(ErrorCode::kResourceExhausted, "indent result past 256 MiB");
  }
  std::string rv;
  if (truthy(a[2])) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += '\n';
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (truthy(a[1])) rv = indention + rv;
  return Value::string(std::move(rv));
}

Expected<Value> filter_first_last(const Value& v, bool first) {
  if (v.kind() == Value::Kind::kList && v.list().kind == SeqKind::kGenerator && !first) {
    return type_error("'generator' object is not reversible");
  }
  KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(v));
  if (items.empty()) {
    return Value::undefined(first ? "No first item, sequence was empty." : "No last item, sequence was empty.");
  }
  return first ? items.front() : items.back();
}

Expected<Value> filter_reverse(const Value& v) {
  if (v.is_string()) {
    const std::vector<size_t> off = code_point_offsets(v.str());
    std::string out;
    out.reserve(v.str().size());
    for (size_t k = off.size() - 1; k > 0; --k) out.append(v.str(), off[k - 1], off[k] - off[k - 1]);
    return Value::string(std::move(out), v.markup());
  }
  KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(v));
  std::reverse(items.begin(), items.end());
  // reversed(seq) is an iterator in Python; only list(...) of a generator gives a list.
  const bool was_generator = v.kind() == Value::Kind::kList && v.list().kind == SeqKind::kGenerator;
  return Value::list(std::move(items), was_generator ? SeqKind::kList : SeqKind::kGenerator);
}

// select / reject / selectattr / rejectattr: items whose test (or truthiness) is `keep`.
Expected<Value> filter_select(Evaluator& ev, const Value& v, CallArgs args, bool by_attr, bool keep) {
  KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(v));
  std::vector<Value> rest = std::move(args.positional);
  if (!args.keyword.empty()) return unsupported("keyword arguments to select / reject");
  Value attr;
  if (by_attr) {
    if (rest.empty()) return type_error("selectattr / rejectattr need an attribute");
    attr = rest.front();
    rest.erase(rest.begin());
  }
  std::string test;
  if (!rest.empty()) {
    if (!rest.front().is_string()) return type_error("the test name must be a string");
    test = rest.front().str();
    rest.erase(rest.begin());
    if (!is_supported_test(test)) {
      if (is_known_test(test)) return unsupported("the test '" + test + "'");
      return type_error("No test named '" + test + "'.");
    }
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      KESTREL_TRY_ASSIGN(subject, get_attribute_path(item, attr));
    }
    bool pass = false;
    if (test.empty()) {
      pass = truthy(subject);
    } else {
      CallArgs targs;
      targs.positional = rest;
      KESTREL_TRY_ASSIGN(pass, apply_test(ev, test, subject, std::move(targs)));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out), SeqKind::kGenerator);
}

Expected<Value> filter_map(Evaluator& ev, const Value& v, CallArgs args) {
  KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(v));
  std::vector<Value> out;
  out.reserve(items.size());
  if (args.positional.empty()) {
    // map(attribute="x", default=...)
    KESTREL_TRY_ASSIGN(auto a, bind_args("map", std::move(args), {{"attribute", true}, {"default"}}));
    const bool has_default = !a[1].is_none();
    for (const Value& item : items) {
      KESTREL_TRY_ASSIGN(Value subject, get_attribute_path(item, a[0]));
      if (subject.is_undefined() && has_default) subject = a[1];
      out.push_back(std::move(subject));
    }
    return Value::list(std::move(out), SeqKind::kGenerator);
  }
  if (!args.positional.front().is_string()) return type_error("the filter name must be a string");
  const std::string name = args.positional.front().str();
  if (!is_supported_filter(name)) {
    if (is_known_filter(name)) return unsupported("the filter '" + name + "'");
    return type_error("No filter named '" + name + "'.");
  }
  CallArgs fargs;
  fargs.positional.assign(args.positional.begin() + 1, args.positional.end());
  fargs.keyword = std::move(args.keyword);
  for (const Value& item : items) {
    KESTREL_TRY_ASSIGN(Value r, apply_filter(ev, name, item, fargs));
    out.push_back(std::move(r));
  }
  return Value::list(std::move(out), SeqKind::kGenerator);
}

}  // namespace

bool is_supported_filter(std::string_view name) { return listed(kSupportedFilters, name); }
bool is_known_filter(std::string_view name) {
  return listed(kSupportedFilters, name) || listed(kOtherJinjaFilters, name);
}

Expected<Value> apply_filter(Evaluator& ev, std::string_view name, const Value& v, CallArgs args) {
  if (name == "length" || name == "count") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    KESTREL_TRY_ASSIGN(int64_t n, py_len(v));
    return Value::integer(n);
  }
  if (name == "tojson") return filter_tojson(v, std::move(args));
  if (name == "trim") return filter_trim(v, std::move(args));
  if (name == "default" || name == "d") {
    KESTREL_TRY_ASSIGN(
        auto a, bind_args(name, std::move(args),
                          {{"default_value", false, Value::string("")}, {"boolean", false, Value::boolean(false)}}));
    if (v.is_undefined() || (truthy(a[1]) && !truthy(v))) return a[0];
    return v;
  }
  if (name == "items") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    if (v.is_undefined()) return Value::list({}, SeqKind::kGenerator);
    if (v.kind() != Value::Kind::kDict) return type_error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, val] : v.dict().entries) out.push_back(Value::list({k, val}, SeqKind::kTuple));
    return Value::list(std::move(out), SeqKind::kGenerator);
  }
  if (name == "first" || name == "last") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    return filter_first_last(v, name == "first");
  }
  if (name == "join") return filter_join(ev, v, std::move(args));
  if (name == "upper" || name == "lower" || name == "capitalize") return filter_case(name, v, std::move(args));
  if (name == "replace") return filter_replace(v, std::move(args));
  if (name == "string") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    return soft_str(v);
  }
  if (name == "int") return filter_int(v, std::move(args));
  if (name == "float") return filter_float(v, std::move(args));
  if (name == "list") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(v));
    return Value::list(std::move(items));
  }
  if (name == "safe") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    KESTREL_TRY_ASSIGN(std::string s, py_str(v));
    return Value::string(std::move(s), true);
  }
  if (name == "abs") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    if (v.kind() == Value::Kind::kFloat) return Value::number(std::fabs(v.as_float()));
    if (v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool) {
      if (v.as_int() == INT64_MIN) return unsupported("integer arithmetic beyond 64 bits");
      return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    if (v.is_undefined()) return undefined_error(v);
    return type_error("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "indent") return filter_indent(v, std::move(args));
  if (name == "reverse") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    return filter_reverse(v);
  }
  if (name == "select" || name == "reject") return filter_select(ev, v, std::move(args), false, name == "select");
  if (name == "selectattr" || name == "rejectattr") {
    return filter_select(ev, v, std::move(args), true, name == "selectattr");
  }
  if (name == "map") return filter_map(ev, v, std::move(args));
  return unsupported("the filter '" + std::string(name) + "'");
}

}  // namespace kestrel::chat::jinja
