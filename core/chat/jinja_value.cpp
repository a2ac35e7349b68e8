// Python semantics of Values: truthiness, ==, ordering, str(), repr(), len(), iteration, `in` (jinja_value.h).
#include "core/chat/jinja_value.h"

#include <algorithm>
#include <cmath>

#include "core/chat/jinja_text.h"

namespace kestrel::chat::jinja {

Value::Value() = default;

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}
Value Value::string(std::string s, bool markup) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  v.markup_ = markup;
  return v;
}
namespace {

uint16_t nested_depth(uint16_t child_max) { return child_max == UINT16_MAX ? child_max : child_max + 1; }

}  // namespace

Value Value::list(std::vector<Value> items, SeqKind kind) {
  Value v;
  v.kind_ = Kind::kList;
  uint16_t d = 0;
  for (const Value& item : items) d = std::max(d, item.depth_);
  v.depth_ = nested_depth(d);
  v.list_ = std::make_shared<const List>(List{std::move(items), kind});
  return v;
}
Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  uint16_t depth = 0;
  for (const auto& [k, val] : d.entries) depth = std::max({depth, k.depth_, val.depth_});
  v.depth_ = nested_depth(depth);
  v.dict_ = std::make_shared<const Dict>(std::move(d));
  return v;
}
Value Value::name_space(std::shared_ptr<Namespace> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ns_ = std::move(ns);
  return v;
}
Value Value::callable(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::move(fn);
  return v;
}
Value Value::loop(std::shared_ptr<const LoopState> loop) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.loop_ = std::move(loop);
  return v;
}

double Value::as_float() const {
  switch (kind_) {
    case Kind::kBool: return b_ ? 1.0 : 0.0;
    case Kind::kInt: return static_cast<double>(i_);
    default: return f_;
  }
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : entries) {
    if (py_equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

const Value* Namespace::find(std::string_view name) const {
  for (const auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Namespace::set(std::string_view name, Value v) {
  for (auto& [k, old] : attrs) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  attrs.emplace_back(std::string(name), std::move(v));
}

Error type_error(std::string message) { return make_error(ErrorCode::kInvalidArgument, std::move(message)); }

Error undefined_error(const Value& undef) {
  const std::string_view hint = undef.undefined_hint();
  return make_error(ErrorCode::kInvalidArgument, hint.empty() ? "undefined value" : std::string(hint));
}

Error unsupported(std::string message) { return make_error(ErrorCode::kUnsupported, std::move(message)); }

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return v.markup() ? "Markup" : "str";
    case Value::Kind::kList:
      switch (v.list().kind) {
        case SeqKind::kList: return "list";
        case SeqKind::kTuple: return "tuple";
        case SeqKind::kDictKeys: return "dict_keys";
        case SeqKind::kDictValues: return "dict_values";
        case SeqKind::kDictItems: return "dict_items";
        case SeqKind::kGenerator: return "generator";
      }
      return "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
    case Value::Kind::kLoop: return "LoopContext";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_float() != 0.0;
    case Value::Kind::kString: return !v.str().empty();
    case Value::Kind::kList: return v.list().kind == SeqKind::kGenerator || !v.list().items.empty();
    case Value::Kind::kDict: return !v.dict().entries.empty();
    default: return true;
  }
}

namespace {

bool is_integral(const Value& v) { return v.kind() == Value::Kind::kBool || v.kind() == Value::Kind::kInt; }

// int == float exactly, as Python compares them (no rounding of the int).
bool int_equals_float(int64_t i, double f) {
  if (!std::isfinite(f) || f != std::trunc(f)) return false;
  if (f < -9223372036854775808.0 || f >= 9223372036854775808.0) return false;
  return static_cast<int64_t>(f) == i;
}

bool same_identity(const Value& a, const Value& b) {
  switch (a.kind()) {
    case Value::Kind::kNamespace: return &a.name_space() == &b.name_space();
    case Value::Kind::kCallable: return &a.callable() == &b.callable();
    case Value::Kind::kLoop: return &a.loop() == &b.loop();
    default: return false;
  }
}

}  // namespace

namespace {

bool equal_at(const Value& a, const Value& b, int depth);

}  // namespace

bool py_equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNesting) return false;  // containers that deep are refused when built; this is a backstop
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return a.as_int() == b.as_int();
    if (is_integral(a)) return int_equals_float(a.as_int(), b.as_float());
    if (is_integral(b)) return int_equals_float(b.as_int(), a.as_float());
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList: {
      const List& x = a.list();
      const List& y = b.list();
      if (x.kind == SeqKind::kGenerator) return &x == &y;
      if (x.kind != y.kind || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equal_at(x.items[i], y.items[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (other == nullptr || !equal_at(v, *other, depth + 1)) return false;
      }
      return true;
    }
    default: return same_identity(a, b);
  }
}

}  // namespace

namespace {

const char* order_symbol(Order op) {
  switch (op) {
    case Order::kLt: return "<";
    case Order::kLe: return "<=";
    case Order::kGt: return ">";
    case Order::kGe: return ">=";
  }
  return "<";
}

template <class T>
bool apply_order(const T& x, const T& y, Order op) {
  switch (op) {
    case Order::kLt: return x < y;
    case Order::kLe: return x <= y;
    case Order::kGt: return x > y;
    case Order::kGe: return x >= y;
  }
  return false;
}

}  // namespace

Expected<bool> py_order(const Value& a, const Value& b, Order op) {
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return apply_order(a.as_int(), b.as_int(), op);
    return apply_order(a.as_float(), b.as_float(), op);
  }
  if (a.is_string() && b.is_string()) return apply_order(a.str(), b.str(), op);  // UTF-8 bytes order = code points
  if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList && a.list().kind == b.list().kind &&
      (a.list().kind == SeqKind::kList || a.list().kind == SeqKind::kTuple)) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    const size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!py_equal(x[i], y[i])) return py_order(x[i], y[i], op);
    }
    return apply_order(x.size(), y.size(), op);
  }
  return type_error(std::string("'") + order_symbol(op) + "' not supported between instances of '" + type_name(a) +
                    "' and '" + type_name(b) + "'");
}

namespace {

Status append_repr(const Value& v, std::string& out, int depth);

Status append_items(const std::vector<Value>& items, std::string& out, int depth) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    KESTREL_TRY(append_repr(items[i], out, depth));
  }
  return ok_status();
}

Status append_dict(const Dict& d, std::string& out, int depth) {
  out += '{';
  for (size_t i = 0; i < d.entries.size(); ++i) {
    if (i > 0) out += ", ";
    KESTREL_TRY(append_repr(d.entries[i].first, out, depth));
    out += ": ";
    KESTREL_TRY(append_repr(d.entries[i].second, out, depth));
  }
  out += '}';
  return ok_status();
}

Status append_namespace(const Namespace& ns, std::string& out, int depth) {
  Dict d;
  for (const auto& [k, val] : ns.attrs) d.entries.emplace_back(Value::string(k), val);
  out += "<Namespace ";
  KESTREL_TRY(append_dict(d, out, depth));
  out += '>';
  return ok_status();
}

Status append_repr(const Value& v, std::string& out, int depth) {
  if (depth > kMaxNesting || out.size() > kMaxStringBytes) {
    return make_error(ErrorCode::kResourceExhausted, depth > kMaxNesting
                                                         ? "repr of a value nested too deeply (or containing itself)"
                                                         : "repr of a value past 256 MiB");
  }
  ++depth;
  switch (v.kind()) {
    case Value::Kind::kUndefined: out += "Undefined"; return ok_status();
    case Value::Kind::kString:
      if (v.markup()) {
        out += "Markup(" + py_repr_string(v.str()) + ")";
      } else {
        out += py_repr_string(v.str());
      }
      return ok_status();
    case Value::Kind::kList: {
      const List& l = v.list();
      switch (l.kind) {
        case SeqKind::kList:
          out += '[';
          KESTREL_TRY(append_items(l.items, out, depth));
          out += ']';
          return ok_status();
        case SeqKind::kTuple:
          out += '(';
          KESTREL_TRY(append_items(l.items, out, depth));
          if (l.items.size() == 1) out += ',';
          out += ')';
          return ok_status();
        case SeqKind::kGenerator: return unsupported("printing a generator (Python shows a memory address)");
        default:
          out += type_name(v) + "([";
          KESTREL_TRY(append_items(l.items, out, depth));
          out += "])";
          return ok_status();
      }
    }
    case Value::Kind::kDict: return append_dict(v.dict(), out, depth);
    case Value::Kind::kNamespace: return append_namespace(v.name_space(), out, depth);
    default: {
      KESTREL_TRY_ASSIGN(std::string s, py_str(v));
      out += s;
      return ok_status();
    }
  }
}

}  // namespace

Expected<std::string> py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return std::string();
    case Value::Kind::kNone: return std::string("None");
    case Value::Kind::kBool: return std::string(v.as_bool() ? "True" : "False");
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return py_float_repr(v.as_float());
    case Value::Kind::kString: return v.str();
    case Value::Kind::kList:
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      std::string out;
      KESTREL_TRY(append_repr(v, out, 0));
      return out;
    }
    case Value::Kind::kLoop: {
      const LoopState& l = v.loop();
      return "<LoopContext " + std::to_string(l.index0 + 1) + "/" + std::to_string(l.items->size()) + ">";
    }
    case Value::Kind::kCallable:
      return unsupported("printing " + v.callable().repr() + " (Python shows a memory address)");
  }
  return std::string();
}

Expected<std::string> py_repr(const Value& v) {
  std::string out;
  KESTREL_TRY(append_repr(v, out, 0));
  return out;
}

Expected<int64_t> py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return int64_t{0};
    case Value::Kind::kString: return static_cast<int64_t>(code_point_count(v.str()));
    case Value::Kind::kList:
      if (v.list().kind == SeqKind::kGenerator) return type_error("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.list().items.size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict().entries.size());
    case Value::Kind::kLoop: return static_cast<int64_t>(v.loop().items->size());
    default: return type_error("object of type '" + type_name(v) + "' has no len()");
  }
}

Expected<std::vector<Value>> py_iterate(const Value& v) {
  std::vector<Value> out;
  switch (v.kind()) {
    case Value::Kind::kUndefined: return out;
    case Value::Kind::kList: return v.list().items;
    case Value::Kind::kDict:
      out.reserve(v.dict().entries.size());
      for (const auto& [k, val] : v.dict().entries) out.push_back(k);
      return out;
    case Value::Kind::kString: {
      const std::string& s = v.str();
      if (code_point_count(s) > kMaxListItems) {
        return make_error(ErrorCode::kResourceExhausted, "iterating a string of more than 2^20 characters");
      }
      size_t i = 0;
      while (i < s.size()) {
        const size_t start = i;
        next_code_point(s, i);
        out.push_back(Value::string(s.substr(start, i - start)));
      }
      return out;
    }
    default: return type_error("'" + type_name(v) + "' object is not iterable");
  }
}

Expected<bool> py_contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!needle.is_string()) {
        return type_error("'in <string>' requires string as left operand, not " + type_name(needle));
      }
      return haystack.str().find(needle.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& item : haystack.list().items) {
        if (py_equal(item, needle)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (needle.kind() == Value::Kind::kDict ||
          (needle.kind() == Value::Kind::kList && needle.list().kind != SeqKind::kTuple)) {
        return type_error("unhashable type: '" + type_name(needle) + "'");
      }
      return haystack.dict().find(needle) != nullptr;
    default: return type_error("argument of type '" + type_name(haystack) + "' is not iterable");
  }
}

}  // namespace kestrel::chat::jinja
