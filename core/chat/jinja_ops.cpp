// Operators, attribute and item access, slicing (jinja_ops.h).
#include "core/chat/jinja_ops.h"

#include <cmath>
#include <limits>

#include "core/chat/jinja_methods.h"
#include "core/chat/jinja_text.h"

namespace kestrel::chat::jinja {

namespace {

bool integral(const Value& v) { return v.kind() == Value::Kind::kBool || v.kind() == Value::Kind::kInt; }

Error operand_error(const char* op, const Value& a, const Value& b) {
  return type_error(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
}

Error overflow() { return unsupported("integer arithmetic beyond 64 bits"); }

// CPython's float floor division and modulo (Objects/floatobject.c float_divmod).
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Expected<Value> repeat(const Value& seq, int64_t n, size_t max_bytes) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (!s.empty() && static_cast<uint64_t>(n) > max_bytes / s.size()) {
      return make_error(ErrorCode::kResourceExhausted, "string repetition past the output limit");
    }
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::string(std::move(out), seq.markup());
  }
  const List& l = seq.list();
  if (!l.items.empty() && static_cast<uint64_t>(n) > kMaxListItems / l.items.size()) {
    return make_error(ErrorCode::kResourceExhausted, "list repetition past the output limit");
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return Value::list(std::move(out), l.kind);
}

bool repeatable(const Value& v) {
  return v.is_string() ||
         (v.kind() == Value::Kind::kList && (v.list().kind == SeqKind::kList || v.list().kind == SeqKind::kTuple));
}

Expected<Value> add(const Value& a, const Value& b, size_t max_bytes) {
  if (a.is_number() && b.is_number()) {
    if (integral(a) && integral(b)) {
      int64_t r = 0;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return overflow();
      return Value::integer(r);
    }
    return Value::number(a.as_float() + b.as_float());
  }
  if (a.is_string() && b.is_string()) {
    if (a.str().size() + b.str().size() > max_bytes) {
      return make_error(ErrorCode::kResourceExhausted, "string concatenation past the output limit");
    }
    // markupsafe: Markup + str escapes the str (and str + Markup, through Markup.__radd__).
    if (a.markup() != b.markup()) {
      return Value::string(a.markup() ? a.str() + html_escape(b.str()) : html_escape(a.str()) + b.str(), true);
    }
    return Value::string(a.str() + b.str(), a.markup());
  }
  if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList && a.list().kind == b.list().kind &&
      (a.list().kind == SeqKind::kList || a.list().kind == SeqKind::kTuple)) {
    if (a.list().items.size() + b.list().items.size() > kMaxListItems) {
      return make_error(ErrorCode::kResourceExhausted, "a list of more than 2^20 items");
    }
    std::vector<Value> items = a.list().items;
    items.insert(items.end(), b.list().items.begin(), b.list().items.end());
    return Value::list(std::move(items), a.list().kind);
  }
  if (a.is_string()) return type_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
  if (a.kind() == Value::Kind::kList && a.list().kind == SeqKind::kList) {
    return type_error("can only concatenate list (not \"" + type_name(b) + "\") to list");
  }
  if (a.kind() == Value::Kind::kList && a.list().kind == SeqKind::kTuple) {
    return type_error("can only concatenate tuple (not \"" + type_name(b) + "\") to tuple");
  }
  return operand_error("+", a, b);
}

Expected<Value> int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if ((exp & 1) != 0 && __builtin_mul_overflow(result, base, &result)) return overflow();
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return overflow();
  }
  return Value::integer(result);
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Expected<Value> binary_op(BinaryOp op, const Value& a, const Value& b, size_t max_bytes) {
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = numbers && integral(a) && integral(b);
  switch (op) {
    case BinaryOp::kAdd: return add(a, b, max_bytes);
    case BinaryOp::kSub:
      if (!numbers) return operand_error("-", a, b);
      if (ints) {
        int64_t r = 0;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return overflow();
        return Value::integer(r);
      }
      return Value::number(a.as_float() - b.as_float());
    case BinaryOp::kMul:
      if (ints) {
        int64_t r = 0;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return overflow();
        return Value::integer(r);
      }
      if (numbers) return Value::number(a.as_float() * b.as_float());
      if (repeatable(a) && integral(b)) return repeat(a, b.as_int(), max_bytes);
      if (integral(a) && repeatable(b)) return repeat(b, a.as_int(), max_bytes);
      if (a.is_string() || b.is_string()) {
        return type_error("can't multiply sequence by non-int of type '" + type_name(a.is_string() ? b : a) + "'");
      }
      return operand_error("*", a, b);
    case BinaryOp::kDiv:
      if (!numbers) return operand_error("/", a, b);
      if (b.as_float() == 0) return type_error(ints ? "division by zero" : "float division by zero");
      if (ints) return Value::number(static_cast<double>(a.as_int()) / static_cast<double>(b.as_int()));
      return Value::number(a.as_float() / b.as_float());
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMod: {
      const bool floordiv = op == BinaryOp::kFloorDiv;
      if (a.is_string() && !floordiv) return unsupported("printf-style '%' formatting of strings");
      if (!numbers) return operand_error(floordiv ? "//" : "%", a, b);
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) return type_error("integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) return overflow();
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          r += y;
          q -= 1;
        }
        return Value::integer(floordiv ? q : r);
      }
      if (b.as_float() == 0) return type_error(floordiv ? "float floor division by zero" : "float modulo");
      double q = 0, r = 0;
      float_divmod(a.as_float(), b.as_float(), q, r);
      return Value::number(floordiv ? q : r);
    }
    case BinaryOp::kPow:
      if (!numbers) return operand_error("** or pow()", a, b);
      if (ints && b.as_int() >= 0) return int_pow(a.as_int(), b.as_int());
      if (a.as_float() == 0 && b.as_float() < 0) return type_error("0.0 cannot be raised to a negative power");
      if (a.as_float() < 0 && b.as_float() != std::trunc(b.as_float())) {
        return unsupported("a negative number raised to a fractional power (a complex result)");
      }
      return Value::number(std::pow(a.as_float(), b.as_float()));
  }
  return operand_error("?", a, b);
}

Expected<Value> unary_minus(const Value& v) {
  if (v.is_undefined()) return undefined_error(v);
  if (integral(v)) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) return overflow();
    return Value::integer(-v.as_int());
  }
  if (v.kind() == Value::Kind::kFloat) return Value::number(-v.as_float());
  return type_error("bad operand type for unary -: '" + type_name(v) + "'");
}

Expected<Value> unary_plus(const Value& v) {
  if (v.is_undefined()) return undefined_error(v);
  if (integral(v)) return Value::integer(v.as_int());
  if (v.kind() == Value::Kind::kFloat) return v;
  return type_error("bad operand type for unary +: '" + type_name(v) + "'");
}

namespace {

// jinja2's object_type_repr: "dict object", "None", ...
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.kind() == Value::Kind::kNamespace) return "jinja2.utils.Namespace object";
  if (v.kind() == Value::Kind::kLoop) return "jinja2.runtime.LoopContext object";
  return type_name(v) + " object";
}

Value missing_attribute(const Value& obj, std::string_view name) {
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + std::string(name) + "'");
}

Value missing_element(const Value& obj, const Value& key) {
  if (key.is_string()) return missing_attribute(obj, key.str());
  auto r = py_repr(key);
  return Value::undefined("'" + object_type_repr(obj) + "' has no element " + (r ? *r : std::string("?")));
}

Value loop_attr(const Value& obj, std::string_view name) {
  const LoopState& l = obj.loop();
  const auto length = static_cast<int64_t>(l.items->size());
  const auto i = static_cast<int64_t>(l.index0);
  if (name == "index0") return Value::integer(i);
  if (name == "index") return Value::integer(i + 1);
  if (name == "revindex0") return Value::integer(length - i - 1);
  if (name == "revindex") return Value::integer(length - i);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == length - 1);
  if (name == "length") return Value::integer(length);
  if (name == "depth0") return Value::integer(l.depth0);
  if (name == "depth") return Value::integer(l.depth0 + 1);
  if (name == "previtem") return i > 0 ? (*l.items)[l.index0 - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem") {
    return i + 1 < length ? (*l.items)[l.index0 + 1] : Value::undefined("there is no next item");
  }
  if (auto m = find_method(obj, name)) return *m;
  return missing_attribute(obj, name);
}

bool is_dunder(std::string_view name) { return name.size() > 4 && name.starts_with("__") && name.ends_with("__"); }

// Python index of a list / tuple / str with `key` (bool or int); nullopt when out of range.
std::optional<size_t> py_index(int64_t key, size_t size) {
  const auto n = static_cast<int64_t>(size);
  if (key < 0) key += n;
  if (key < 0 || key >= n) return std::nullopt;
  return static_cast<size_t>(key);
}

}  // namespace

Expected<Value> get_attr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: return undefined_error(obj);
    case Value::Kind::kNamespace: {
      const Value* v = obj.name_space().find(name);
      return v != nullptr ? *v : missing_attribute(obj, name);
    }
    case Value::Kind::kLoop: return loop_attr(obj, name);
    case Value::Kind::kCallable: return unsupported("attributes of " + obj.callable().repr());
    default: break;
  }
  if (is_dunder(name)) {
    return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(obj) +
                            "' object is unsafe.");
  }
  if (auto m = find_method(obj, name)) return *m;
  if (obj.kind() == Value::Kind::kDict) {
    const Value* v = obj.dict().find(name);
    if (v != nullptr) return *v;
  }
  return missing_attribute(obj, name);
}

Expected<Value> get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: return undefined_error(obj);
    case Value::Kind::kDict: {
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    }
    case Value::Kind::kList: {
      const List& l = obj.list();
      if ((l.kind == SeqKind::kList || l.kind == SeqKind::kTuple) && integral(key)) {
        if (auto i = py_index(key.as_int(), l.items.size())) return l.items[*i];
        return missing_element(obj, key);
      }
      break;
    }
    case Value::Kind::kString:
      if (integral(key)) {
        const std::vector<size_t> off = code_point_offsets(obj.str());
        if (auto i = py_index(key.as_int(), off.size() - 1)) {
          return Value::string(obj.str().substr(off[*i], off[*i + 1] - off[*i]));
        }
        return missing_element(obj, key);
      }
      break;
    default: break;
  }
  // jinja2's sandbox: a failed subscript with a string falls back to the attribute of that name.
  if (key.is_string()) {
    if (obj.kind() == Value::Kind::kDict) {
      if (is_dunder(key.str())) return get_attr(obj, key.str());
      if (auto m = find_method(obj, key.str())) return *m;
      return missing_element(obj, key);
    }
    return get_attr(obj, key.str());
  }
  return missing_element(obj, key);
}

Expected<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) return undefined_error(obj);
  const bool is_seq =
      obj.kind() == Value::Kind::kList && (obj.list().kind == SeqKind::kList || obj.list().kind == SeqKind::kTuple);
  // A bad slice (wrong bound types, unsliceable object) is a TypeError, which jinja2's sandbox turns into Undefined.
  auto bad = [&] { return Value::undefined("'" + object_type_repr(obj) + "' cannot be sliced this way"); };
  if (!is_seq && !obj.is_string()) return bad();
  for (const Value* b : {&start, &stop, &step}) {
    if (!b->is_none() && !integral(*b)) return bad();
  }
  const int64_t st = step.is_none() ? 1 : step.as_int();
  if (st == 0) return type_error("slice step cannot be zero");
  std::vector<size_t> offsets;
  int64_t n = 0;
  if (obj.is_string()) {
    offsets = code_point_offsets(obj.str());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else {
    n = static_cast<int64_t>(obj.list().items.size());
  }
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, bool is_start) -> int64_t {
    if (v.is_none()) return is_start ? (st < 0 ? n - 1 : 0) : (st < 0 ? -1 : n);
    int64_t x = v.as_int();
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t b = adjust(start, true);
  const int64_t e = adjust(stop, false);
  std::vector<int64_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(i);
  if (obj.is_string()) {
    std::string out;
    const std::string& s = obj.str();
    for (const int64_t i : picks) {
      const auto k = static_cast<size_t>(i);
      out.append(s, offsets[k], offsets[k + 1] - offsets[k]);
    }
    return Value::string(std::move(out), obj.markup());
  }
  std::vector<Value> out;
  out.reserve(picks.size());
  for (const int64_t i : picks) out.push_back(obj.list().items[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.list().kind);
}

}  // namespace kestrel::chat::jinja
