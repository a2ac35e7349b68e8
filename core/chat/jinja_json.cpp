// json.dumps with Python's output (jinja_json.h).
#include "core/chat/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/chat/jinja_text.h"

namespace kestrel::chat::jinja {

namespace {

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t start = i;
      const char32_t cp = next_code_point(s, i);
      if (!ensure_ascii) {
        out.append(s, start, i - start);
      } else if (cp < 0x10000) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        out += buf;
      } else {
        const char32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)),
                      static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
        out += buf;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        // Control characters always; DEL too under ensure_ascii (Python escapes everything outside ' '..'~').
        if (c < 0x20 || (c == 0x7F && ensure_ascii)) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(d);
}

class Encoder {
 public:
  explicit Encoder(const JsonDumpOptions& o) : o_(o) {
    item_sep_ = o.item_separator ? *o.item_separator : (o.indent ? "," : ", ");
    key_sep_ = o.key_separator ? *o.key_separator : ": ";
  }

  Status encode(const Value& v, int level) {
    // Python raises RecursionError for a structure that deep (a namespace cannot be encoded, so no cycles).
    if (level > kMaxNesting) return make_error(ErrorCode::kResourceExhausted, "tojson of a value nested too deeply");
    if (out_.size() > kMaxStringBytes) return make_error(ErrorCode::kResourceExhausted, "tojson result past 256 MiB");
    switch (v.kind()) {
      case Value::Kind::kNone: out_ += "null"; return ok_status();
      case Value::Kind::kBool: out_ += v.as_bool() ? "true" : "false"; return ok_status();
      case Value::Kind::kInt: out_ += std::to_string(v.as_int()); return ok_status();
      case Value::Kind::kFloat: out_ += float_json(v.as_float()); return ok_status();
      case Value::Kind::kString: append_json_string(out_, v.str(), o_.ensure_ascii); return ok_status();
      case Value::Kind::kList:
        if (v.list().kind == SeqKind::kList || v.list().kind == SeqKind::kTuple) return encode_list(v.list(), level);
        break;
      case Value::Kind::kDict: return encode_dict(v.dict(), level);
      default: break;
    }
    return type_error("Object of type " + type_name(v) + " is not JSON serializable");
  }

  std::string take() { return std::move(out_); }

 private:
  // Before an item: the separator (not before the first) and, with indent, a new line at `level`.
  void item_start(bool first, int level) {
    if (!first) out_ += item_sep_;
    if (o_.indent) {
      out_ += '\n';
      for (int i = 0; i < level; ++i) out_ += *o_.indent;
    }
  }
  void close(char c, int level) {
    if (o_.indent) {
      out_ += '\n';
      for (int i = 0; i < level; ++i) out_ += *o_.indent;
    }
    out_ += c;
  }

  Status encode_list(const List& l, int level) {
    if (l.items.empty()) {
      out_ += "[]";
      return ok_status();
    }
    out_ += '[';
    for (size_t i = 0; i < l.items.size(); ++i) {
      item_start(i == 0, level + 1);
      KESTREL_TRY(encode(l.items[i], level + 1));
    }
    close(']', level);
    return ok_status();
  }

  // A dict key as json.dumps writes it: str as is; True/False/None as true/false/null; int and float as text.
  static Expected<std::string> key_text(const Value& k) {
    switch (k.kind()) {
      case Value::Kind::kString: return k.str();
      case Value::Kind::kBool: return std::string(k.as_bool() ? "true" : "false");
      case Value::Kind::kNone: return std::string("null");
      case Value::Kind::kInt: return std::to_string(k.as_int());
      case Value::Kind::kFloat: return float_json(k.as_float());
      default: return type_error("keys must be str, int, float, bool or None, not " + type_name(k));
    }
  }

  Status encode_dict(const Dict& d, int level) {
    if (d.entries.empty()) {
      out_ += "{}";
      return ok_status();
    }
    std::vector<const std::pair<Value, Value>*> entries;
    entries.reserve(d.entries.size());
    for (const auto& e : d.entries) entries.push_back(&e);
    if (o_.sort_keys) {
      Status failed = ok_status();
      std::stable_sort(entries.begin(), entries.end(), [&](const auto* a, const auto* b) {
        auto lt = py_order(a->first, b->first, Order::kLt);
        if (!lt) {
          if (failed) failed = lt.error();
          return false;
        }
        return *lt;
      });
      if (!failed) return failed;
    }
    out_ += '{';
    bool first = true;
    for (const auto* e : entries) {
      item_start(first, level + 1);
      first = false;
      KESTREL_TRY_ASSIGN(std::string key, key_text(e->first));
      append_json_string(out_, key, o_.ensure_ascii);
      out_ += key_sep_;
      KESTREL_TRY(encode(e->second, level + 1));
    }
    close('}', level);
    return ok_status();
  }

  const JsonDumpOptions& o_;
  std::string item_sep_, key_sep_;
  std::string out_;
};

// Recursion over either nlohmann type; `text_bytes` adds up the bytes of every string.
constexpr int kMaxJsonDepth = 512;

// `text_bytes` adds up the bytes of every string (the rendering is about that long).
template <class Json>
Expected<Value> to_value(const Json& j, int depth, size_t& text_bytes) {
  if (depth > kMaxJsonDepth) return make_error(ErrorCode::kInvalidArgument, "the context is nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return make_error(ErrorCode::kUnsupported, "an integer in the context beyond 64 bits: " + std::to_string(u));
      }
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = j.template get_ref<const std::string&>();
      if (!valid_utf8(s)) return make_error(ErrorCode::kInvalidArgument, "a string in the context is not UTF-8");
      text_bytes += s.size();
      return Value::string(s);
    }
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) {
        KESTREL_TRY_ASSIGN(Value v, to_value(item, depth + 1, text_bytes));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!valid_utf8(it.key())) return make_error(ErrorCode::kInvalidArgument, "a key in the context is not UTF-8");
        KESTREL_TRY_ASSIGN(Value v, to_value(it.value(), depth + 1, text_bytes));
        d.entries.emplace_back(Value::string(it.key()), std::move(v));
      }
      return Value::dict(std::move(d));
    }
    default: return make_error(ErrorCode::kInvalidArgument, "the context holds a value JSON cannot (binary)");
  }
}

}  // namespace

Expected<std::string> json_dumps(const Value& v, const JsonDumpOptions& options) {
  Encoder e(options);
  KESTREL_TRY(e.encode(v, 0));
  return e.take();
}

}  // namespace kestrel::chat::jinja

namespace kestrel::chat::jinja {

Expected<Value> value_from_json(const nlohmann::json& j, size_t* text_bytes) {
  size_t bytes = 0;
  auto v = to_value(j, 0, bytes);
  if (text_bytes != nullptr) *text_bytes = bytes;
  return v;
}

Expected<Value> value_from_json(const nlohmann::ordered_json& j, size_t* text_bytes) {
  size_t bytes = 0;
  auto v = to_value(j, 0, bytes);
  if (text_bytes != nullptr) *text_bytes = bytes;
  return v;
}

}  // namespace kestrel::chat::jinja
