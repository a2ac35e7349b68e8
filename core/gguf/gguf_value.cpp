// GgufValue: construction, checked conversions, exact comparison and the short rendering `kestrel inspect` prints.
//
// Storage: integers and bool in u_ (bits) and i_ (signed view), floats as their on-disk bits in u_ plus a double in
// f_, strings in s_, array items in a shared immutable vector. See gguf_value.h for the contract.
#include "core/gguf/gguf_value.h"

#include <bit>
#include <charconv>
#include <cstdio>
#include <limits>
#include <system_error>

namespace kestrel {

std::string_view gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "u8";
    case GgufValueType::kInt8: return "i8";
    case GgufValueType::kUint16: return "u16";
    case GgufValueType::kInt16: return "i16";
    case GgufValueType::kUint32: return "u32";
    case GgufValueType::kInt32: return "i32";
    case GgufValueType::kFloat32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "u64";
    case GgufValueType::kInt64: return "i64";
    case GgufValueType::kFloat64: return "f64";
  }
  return "invalid";
}

bool gguf_value_type_is_valid(uint32_t raw) { return raw <= static_cast<uint32_t>(GgufValueType::kFloat64); }

namespace {

bool is_unsigned_type(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}

bool is_signed_type(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

const std::vector<GgufValue>& empty_items() {
  static const std::vector<GgufValue> empty;
  return empty;
}

Error type_error(GgufValueType actual, std::string_view expected) {
  return make_error(ErrorCode::kInvalidArgument,
                    "value is " + std::string(gguf_value_type_name(actual)) + ", expected " + std::string(expected));
}

// Appends `s` quoted with `quote`, escaping the quote, backslash and control bytes, cut to at most `max_bytes` of
// content (never inside a UTF-8 sequence); a cut string gets `...` and its full length after the closing quote.
void append_quoted(std::string& out, std::string_view s, char quote, size_t max_bytes) {
  size_t n = s.size();
  if (n > max_bytes) {
    n = max_bytes;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // back off to a code point start
  }
  out += quote;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
}

template <class F>
void append_float(std::string& out, F v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest text that reads back as the same value
  if (ec == std::errc()) out.append(buf, end);
}

void describe_into(std::string& out, const GgufValue& v, size_t max_items, bool in_array) {
  switch (v.type()) {
    case GgufValueType::kUint8:
    case GgufValueType::kUint16:
    case GgufValueType::kUint32:
    case GgufValueType::kUint64: out += std::to_string(v.raw_u64()); return;
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64: out += std::to_string(v.raw_i64()); return;
    case GgufValueType::kFloat32: append_float(out, std::bit_cast<float>(static_cast<uint32_t>(v.raw_u64()))); return;
    case GgufValueType::kFloat64: append_float(out, std::bit_cast<double>(v.raw_u64())); return;
    case GgufValueType::kBool: out += v.raw_u64() ? "true" : "false"; return;
    case GgufValueType::kString:
      if (in_array) {
        append_quoted(out, v.raw_string(), '\'', 24);
      } else {
        append_quoted(out, v.raw_string(), '"', 60);
      }
      return;
    case GgufValueType::kArray: {
      const auto& items = v.items();
      out += '[';
      out += gguf_value_type_name(v.array_type());
      out += " x " + std::to_string(items.size()) + "] [";
      const size_t shown = items.size() < max_items ? items.size() : max_items;
      for (size_t i = 0; i < shown; ++i) {
        if (i) out += ", ";
        describe_into(out, items[i], max_items, true);
      }
      if (shown < items.size()) out += shown ? ", ..." : "...";
      out += ']';
      return;
    }
  }
}

}  // namespace

GgufValue GgufValue::u8(uint8_t v) { return u64(v).retype(GgufValueType::kUint8); }
GgufValue GgufValue::u16(uint16_t v) { return u64(v).retype(GgufValueType::kUint16); }
GgufValue GgufValue::u32(uint32_t v) { return u64(v).retype(GgufValueType::kUint32); }
GgufValue GgufValue::u64(uint64_t v) {
  GgufValue r;
  r.type_ = GgufValueType::kUint64;
  r.u_ = v;
  r.i_ = static_cast<int64_t>(v);
  r.f_ = static_cast<double>(v);
  return r;
}

GgufValue GgufValue::i8(int8_t v) { return i64(v).retype(GgufValueType::kInt8); }
GgufValue GgufValue::i16(int16_t v) { return i64(v).retype(GgufValueType::kInt16); }
GgufValue GgufValue::i32(int32_t v) { return i64(v).retype(GgufValueType::kInt32); }
GgufValue GgufValue::i64(int64_t v) {
  GgufValue r;
  r.type_ = GgufValueType::kInt64;
  r.u_ = static_cast<uint64_t>(v);
  r.i_ = v;
  r.f_ = static_cast<double>(v);
  return r;
}

GgufValue GgufValue::f32(float v) {
  GgufValue r;
  r.type_ = GgufValueType::kFloat32;
  r.u_ = std::bit_cast<uint32_t>(v);
  r.f_ = static_cast<double>(v);
  return r;
}

GgufValue GgufValue::f64(double v) {
  GgufValue r;
  r.type_ = GgufValueType::kFloat64;
  r.u_ = std::bit_cast<uint64_t>(v);
  r.f_ = v;
  return r;
}

GgufValue GgufValue::boolean(bool v) { return u64(v ? 1 : 0).retype(GgufValueType::kBool); }

GgufValue GgufValue::string(std::string v) {
  GgufValue r;
  r.type_ = GgufValueType::kString;
  r.s_ = std::move(v);
  return r;
}

GgufValue GgufValue::array(GgufValueType element_type, std::vector<GgufValue> items) {
  GgufValue r;
  r.type_ = GgufValueType::kArray;
  r.array_type_ = element_type;
  r.items_ = std::make_shared<const std::vector<GgufValue>>(std::move(items));
  return r;
}

GgufValue GgufValue::string_array(const std::vector<std::string>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (const auto& s : items) v.push_back(string(s));
  return array(GgufValueType::kString, std::move(v));
}

GgufValue GgufValue::i32_array(const std::vector<int32_t>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (int32_t x : items) v.push_back(i32(x));
  return array(GgufValueType::kInt32, std::move(v));
}

GgufValue GgufValue::f32_array(const std::vector<float>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (float x : items) v.push_back(f32(x));
  return array(GgufValueType::kFloat32, std::move(v));
}

GgufValue GgufValue::retype(GgufValueType type) && {
  type_ = type;
  return std::move(*this);
}

bool GgufValue::is_integer() const { return is_unsigned_type(type_) || is_signed_type(type_); }

Expected<uint64_t> GgufValue::to_u64() const {
  if (is_unsigned_type(type_) || type_ == GgufValueType::kBool) return u_;
  if (is_signed_type(type_)) {
    if (i_ < 0) {
      return make_error(ErrorCode::kInvalidArgument, "value " + std::to_string(i_) + " (" +
                                                         std::string(gguf_value_type_name(type_)) +
                                                         ") is negative, expected an unsigned integer");
    }
    return static_cast<uint64_t>(i_);
  }
  return type_error(type_, "an unsigned integer");
}

Expected<int64_t> GgufValue::to_i64() const {
  if (is_signed_type(type_)) return i_;
  if (is_unsigned_type(type_)) {
    if (u_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return make_error(
          ErrorCode::kInvalidArgument,
          "value " + std::to_string(u_) + " (" + std::string(gguf_value_type_name(type_)) + ") does not fit in int64");
    }
    return static_cast<int64_t>(u_);
  }
  return type_error(type_, "an integer");
}

Expected<double> GgufValue::to_f64() const {
  if (type_ == GgufValueType::kFloat32) return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(u_)));
  if (type_ == GgufValueType::kFloat64) return std::bit_cast<double>(u_);
  if (is_unsigned_type(type_)) return static_cast<double>(u_);
  if (is_signed_type(type_)) return static_cast<double>(i_);
  return type_error(type_, "a number");
}

Expected<bool> GgufValue::to_bool() const {
  if (type_ == GgufValueType::kBool) return u_ != 0;
  return type_error(type_, "bool");
}

Expected<std::string_view> GgufValue::to_string() const {
  if (type_ == GgufValueType::kString) return std::string_view(s_);
  return type_error(type_, "string");
}

const std::vector<GgufValue>& GgufValue::items() const { return items_ ? *items_ : empty_items(); }

std::string GgufValue::describe(size_t max_items) const {
  std::string out;
  describe_into(out, *this, max_items, false);
  return out;
}

bool GgufValue::operator==(const GgufValue& other) const {
  if (type_ != other.type_) return false;
  switch (type_) {
    case GgufValueType::kString: return s_ == other.s_;
    case GgufValueType::kArray: {
      if (array_type_ != other.array_type_) return false;
      const auto& a = items();
      const auto& b = other.items();
      if (&a == &b) return true;
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!(a[i] == b[i])) return false;
      }
      return true;
    }
    default: return u_ == other.u_;
  }
}

}  // namespace kestrel
