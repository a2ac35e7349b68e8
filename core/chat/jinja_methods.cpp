// str / dict / loop methods and the global functions (jinja_methods.h).
#include "core/chat/jinja_methods.h"

#include <algorithm>
#include <array>

#include "core/chat/jinja_args.h"
#include "core/chat/jinja_eval.h"
#include "core/chat/jinja_text.h"

namespace kestrel::chat::jinja {

namespace {

constexpr std::array<std::string_view, 17> kStrImplemented = {
    "startswith", "endswith",   "split", "rsplit", "strip", "lstrip",     "rstrip",       "replace",     "upper",
    "lower",      "capitalize", "find",  "count",  "join",  "splitlines", "removeprefix", "removesuffix"};
constexpr std::array<std::string_view, 30> kStrOther = {
    "casefold", "center",     "encode",    "expandtabs", "format",       "format_map", "index",     "isalnum",
    "isalpha",  "isascii",    "isdecimal", "isdigit",    "isidentifier", "islower",    "isnumeric", "isprintable",
    "isspace",  "istitle",    "isupper",   "ljust",      "maketrans",    "partition",  "rfind",     "rindex",
    "rjust",    "rpartition", "swapcase",  "title",      "translate",    "zfill"};
constexpr std::array<std::string_view, 4> kDictImplemented = {"get", "items", "keys", "values"};
constexpr std::array<std::string_view, 5> kDictUnsafe = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::array<std::string_view, 2> kDictOther = {"copy", "fromkeys"};
constexpr std::array<std::string_view, 8> kListUnsafe = {"append", "clear",  "extend",  "insert",
                                                         "pop",    "remove", "reverse", "sort"};
constexpr std::array<std::string_view, 3> kListOther = {"copy", "count", "index"};

template <size_t N>
bool contains(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Expected<std::string> str_arg(const Value& v, const std::string& what) {
  if (!v.is_string()) return type_error(what + " must be str, not " + type_name(v));
  return v.str();
}

Expected<bool> affix_match(const Value& self, const Value& affix, bool prefix) {
  const std::string_view s = self.str();
  auto one = [&](const Value& a) -> Expected<bool> {
    if (!a.is_string()) {
      return type_error(std::string(prefix ? "startswith" : "endswith") +
                        " first arg must be str or a tuple of str, not " + type_name(a));
    }
    return prefix ? s.starts_with(a.str()) : s.ends_with(a.str());
  };
  if (affix.kind() == Value::Kind::kList && affix.list().kind == SeqKind::kTuple) {
    for (const Value& a : affix.list().items) {
      KESTREL_TRY_ASSIGN(bool m, one(a));
      if (m) return true;
    }
    return false;
  }
  return one(affix);
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::list(std::move(out));
}

Expected<Value> call_str_method(const Value& self, const std::string& name, CallArgs args) {
  if (self.markup()) return unsupported("the str method " + name + "() on a |safe (Markup) value");
  const std::string& s = self.str();
  if (name == "startswith" || name == "endswith") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"prefix", true}, {"start"}, {"end"}}));
    if (!a[1].is_none() || !a[2].is_none()) return unsupported(name + "() with start / end");
    KESTREL_TRY_ASSIGN(bool m, affix_match(self, a[0], name == "startswith"));
    return Value::boolean(m);
  }
  if (name == "split" || name == "rsplit") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"sep"}, {"maxsplit", false, Value::integer(-1)}}));
    if (a[1].kind() != Value::Kind::kInt && a[1].kind() != Value::Kind::kBool) {
      return type_error("'" + type_name(a[1]) + "' object cannot be interpreted as an integer");
    }
    const int64_t maxsplit = a[1].as_int();
    if (name == "rsplit" && maxsplit >= 0) return unsupported("rsplit() with maxsplit");
    if (a[0].is_none()) return str_list(py_split_whitespace(s, maxsplit));
    KESTREL_TRY_ASSIGN(std::string sep, str_arg(a[0], "separator"));
    if (sep.empty()) return type_error("empty separator");
    return str_list(py_split(s, sep, maxsplit));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"chars"}}));
    const StripSide side = name == "strip" ? StripSide::kBoth : name == "lstrip" ? StripSide::kLeft : StripSide::kRight;
    if (a[0].is_none()) return Value::string(std::string(py_strip(s, side)));
    KESTREL_TRY_ASSIGN(std::string chars, str_arg(a[0], name + " arg"));
    return Value::string(std::string(py_strip_chars(s, chars, side)));
  }
  if (name == "replace") {
    KESTREL_TRY_ASSIGN(
        auto a, bind_args(name, std::move(args), {{"old", true}, {"new", true}, {"count", false, Value::integer(-1)}}));
    KESTREL_TRY_ASSIGN(std::string old, str_arg(a[0], "replace() argument 1"));
    KESTREL_TRY_ASSIGN(std::string rep, str_arg(a[1], "replace() argument 2"));
    if (a[2].kind() != Value::Kind::kInt && a[2].kind() != Value::Kind::kBool) {
      return type_error("'" + type_name(a[2]) + "' object cannot be interpreted as an integer");
    }
    if (py_replace_size(s, old, rep, a[2].as_int()) > kMaxStringBytes) {
      return make_error(ErrorCode::kResourceExhausted, "replace() result past 256 MiB");
    }
    return Value::string(py_replace(s, old, rep, a[2].as_int()));
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    KESTREL_TRY(bind_args(name, std::move(args), {}));
    std::string out;
    if (name == "capitalize") {
      std::string first, rest;
      const size_t cut = s.empty() ? 0 : [&] {
        size_t i = 0;
        next_code_point(s, i);
        return i;
      }();
      if (!ascii_case_map(std::string_view(s).substr(0, cut), true, first) ||
          !ascii_case_map(std::string_view(s).substr(cut), false, rest)) {
        return unsupported("capitalize() of text with non-ASCII letters");
      }
      return Value::string(first + rest);
    }
    if (!ascii_case_map(s, name == "upper", out)) return unsupported(name + "() of text with non-ASCII letters");
    return Value::string(std::move(out));
  }
  if (name == "find" || name == "count") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"sub", true}, {"start"}, {"end"}}));
    if (!a[1].is_none() || !a[2].is_none()) return unsupported(name + "() with start / end");
    KESTREL_TRY_ASSIGN(std::string sub, str_arg(a[0], "must be str"));
    return Value::integer(name == "find" ? py_find(s, sub) : py_count(s, sub));
  }
  if (name == "join") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"iterable", true}}));
    KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(a[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return type_error("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(items[i]) +
                          " found");
      }
      if (i > 0) out += s;
      out += items[i].str();
    }
    return Value::string(std::move(out));
  }
  if (name == "splitlines") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"keepends", false, Value::boolean(false)}}));
    if (truthy(a[0])) return unsupported("splitlines(keepends=True)");
    return str_list(py_splitlines(s));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"affix", true}}));
    KESTREL_TRY_ASSIGN(std::string affix, str_arg(a[0], name + "() argument"));
    std::string_view v = s;
    if (name == "removeprefix" && v.starts_with(affix)) v.remove_prefix(affix.size());
    if (name == "removesuffix" && v.ends_with(affix)) v.remove_suffix(affix.size());
    return Value::string(std::string(v));
  }
  return unsupported("the str method " + name + "()");
}

Expected<Value> call_dict_method(const Value& self, const std::string& name, CallArgs args) {
  const Dict& d = self.dict();
  if (name == "get") {
    KESTREL_TRY_ASSIGN(auto a, bind_args(name, std::move(args), {{"key", true}, {"default"}}));
    if (a[0].kind() == Value::Kind::kDict ||
        (a[0].kind() == Value::Kind::kList && a[0].list().kind != SeqKind::kTuple)) {
      return type_error("unhashable type: '" + type_name(a[0]) + "'");
    }
    const Value* v = d.find(a[0]);
    return v != nullptr ? *v : a[1];
  }
  KESTREL_TRY(bind_args(name, std::move(args), {}));
  std::vector<Value> out;
  out.reserve(d.entries.size());
  for (const auto& [k, v] : d.entries) {
    if (name == "keys") {
      out.push_back(k);
    } else if (name == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::list({k, v}, SeqKind::kTuple));
    }
  }
  const SeqKind kind = name == "keys"     ? SeqKind::kDictKeys
                       : name == "values" ? SeqKind::kDictValues
                                          : SeqKind::kDictItems;
  return Value::list(std::move(out), kind);
}

class BoundMethod final : public Callable {
 public:
  BoundMethod(Value self, std::string_view name, bool implemented)
      : self_(std::move(self)), name_(name), implemented_(implemented) {}

  std::string repr() const override { return "the " + type_name(self_) + " method " + name_ + "()"; }

  Expected<Value> call(Evaluator& /*ev*/, CallArgs args) const override {
    if (!implemented_) return unsupported(repr());
    switch (self_.kind()) {
      case Value::Kind::kString: return call_str_method(self_, name_, std::move(args));
      case Value::Kind::kDict: return call_dict_method(self_, name_, std::move(args));
      case Value::Kind::kLoop: {
        // loop.cycle(a, b, ...): the argument at this iteration's index, modulo their count.
        if (!args.keyword.empty()) return type_error("cycle() takes no keyword arguments");
        if (args.positional.empty()) return type_error("no items for cycling given");
        return args.positional[self_.loop().index0 % args.positional.size()];
      }
      default: return unsupported(repr());
    }
  }

 private:
  Value self_;
  std::string name_;
  bool implemented_;
};

Value bound(const Value& self, std::string_view name, bool implemented) {
  return Value::callable(std::make_shared<BoundMethod>(self, name, implemented));
}

Value unsafe(const Value& self, std::string_view name) {
  return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(self) +
                          "' object is unsafe.");
}

// ---- global functions ----------------------------------------------------------------------------------------

using GlobalFn = Expected<Value> (*)(Evaluator& ev, CallArgs args);

class GlobalFunction final : public Callable {
 public:
  GlobalFunction(std::string_view name, GlobalFn fn) : name_(name), fn_(fn) {}
  std::string repr() const override { return "the function " + name_ + "()"; }
  Expected<Value> call(Evaluator& ev, CallArgs args) const override { return fn_(ev, std::move(args)); }

 private:
  std::string name_;
  GlobalFn fn_;
};

// Items of dict(x) / namespace(x): a dict, or an iterable of key-value pairs.
Status add_pairs(const Value& source, std::vector<std::pair<Value, Value>>& out) {
  if (source.kind() == Value::Kind::kDict) {
    out.insert(out.end(), source.dict().entries.begin(), source.dict().entries.end());
    return ok_status();
  }
  KESTREL_TRY_ASSIGN(std::vector<Value> items, py_iterate(source));
  for (const Value& item : items) {
    KESTREL_TRY_ASSIGN(std::vector<Value> pair, py_iterate(item));
    if (pair.size() != 2)
      return type_error("dictionary update sequence element has length " + std::to_string(pair.size()) +
                        "; 2 is required");
    out.emplace_back(pair[0], pair[1]);
  }
  return ok_status();
}

Expected<Dict> build_dict(const char* fn, CallArgs args) {
  if (args.positional.size() > 1) {
    return type_error(std::string(fn) + " expected at most 1 argument, got " + std::to_string(args.positional.size()));
  }
  std::vector<std::pair<Value, Value>> pairs;
  if (!args.positional.empty()) KESTREL_TRY(add_pairs(args.positional[0], pairs));
  for (auto& [k, v] : args.keyword) pairs.emplace_back(Value::string(k), std::move(v));
  Dict d;
  for (auto& [k, v] : pairs) {
    bool replaced = false;
    for (auto& [ek, ev] : d.entries) {
      if (py_equal(ek, k)) {
        ev = v;
        replaced = true;
        break;
      }
    }
    if (!replaced) d.entries.emplace_back(std::move(k), std::move(v));
  }
  return d;
}

Expected<Value> fn_namespace(Evaluator& ev, CallArgs args) {
  KESTREL_TRY_ASSIGN(Dict d, build_dict("Namespace", std::move(args)));
  std::shared_ptr<Namespace> ns = ev.make_namespace();
  for (auto& [k, v] : d.entries) {
    if (!k.is_string()) return type_error("namespace attribute names must be strings");
    ns->set(k.str(), std::move(v));
  }
  return Value::name_space(std::move(ns));
}

Expected<Value> fn_dict(Evaluator& /*ev*/, CallArgs args) {
  KESTREL_TRY_ASSIGN(Dict d, build_dict("dict", std::move(args)));
  return Value::dict(std::move(d));
}

Expected<Value> fn_range(Evaluator& /*ev*/, CallArgs args) {
  if (!args.keyword.empty()) return type_error("range() takes no keyword arguments");
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) return type_error("range expected 1 to 3 arguments, got " + std::to_string(n));
  for (const Value& a : args.positional) {
    if (a.kind() != Value::Kind::kInt && a.kind() != Value::Kind::kBool) {
      return type_error("'" + type_name(a) + "' object cannot be interpreted as an integer");
    }
  }
  const int64_t start = n == 1 ? 0 : args.positional[0].as_int();
  const int64_t stop = n == 1 ? args.positional[0].as_int() : args.positional[1].as_int();
  const int64_t step = n == 3 ? args.positional[2].as_int() : 1;
  if (step == 0) return type_error("range() arg 3 must not be zero");
  // jinja2's sandbox refuses ranges of more than MAX_RANGE (100000) items.
  // Item count without overflow: the span as an unsigned difference, divided by |step| rounding up.
  uint64_t count = 0;
  if (step > 0 ? stop > start : stop < start) {
    const uint64_t span = step > 0 ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                                   : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
    const uint64_t abs_step = step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
    count = (span - 1) / abs_step + 1;
  }
  if (count > 100000) {
    return type_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  std::vector<Value> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) out.push_back(Value::integer(start + static_cast<int64_t>(i) * step));
  return Value::list(std::move(out));
}

Expected<Value> fn_raise_exception(Evaluator& /*ev*/, CallArgs args) {
  std::string message;
  if (!args.positional.empty()) {
    KESTREL_TRY_ASSIGN(message, py_str(args.positional[0]));
  }
  return make_error(ErrorCode::kInvalidArgument, message);
}

}  // namespace

std::optional<Value> find_method(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kString:
      if (contains(kStrImplemented, name)) return bound(obj, name, true);
      if (contains(kStrOther, name)) return bound(obj, name, false);
      return std::nullopt;
    case Value::Kind::kDict:
      if (contains(kDictImplemented, name)) return bound(obj, name, true);
      if (contains(kDictUnsafe, name)) return unsafe(obj, name);
      if (contains(kDictOther, name)) return bound(obj, name, false);
      return std::nullopt;
    case Value::Kind::kList: {
      const SeqKind k = obj.list().kind;
      if (k == SeqKind::kList && contains(kListUnsafe, name)) return unsafe(obj, name);
      if ((k == SeqKind::kList && contains(kListOther, name)) ||
          (k == SeqKind::kTuple && (name == "count" || name == "index"))) {
        return bound(obj, name, false);
      }
      return std::nullopt;
    }
    case Value::Kind::kLoop:
      if (name == "cycle") return bound(obj, name, true);
      if (name == "changed") return bound(obj, name, false);
      return std::nullopt;
    default: return std::nullopt;
  }
}

std::optional<Value> find_global_function(std::string_view name) {
  static const std::array<std::pair<std::string_view, GlobalFn>, 4> kGlobals = {{
      {"namespace", fn_namespace},
      {"range", fn_range},
      {"dict", fn_dict},
      {"raise_exception", fn_raise_exception},
  }};
  for (const auto& [n, fn] : kGlobals) {
    if (n == name) return Value::callable(std::make_shared<GlobalFunction>(n, fn));
  }
  return std::nullopt;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t cp = next_code_point(s, i);
    const bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                     cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk) continue;
    out.emplace_back(s.substr(start, at - start));
    if (cp == '\r' && i < s.size() && s[i] == '\n') ++i;
    start = i;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

}  // namespace kestrel::chat::jinja
