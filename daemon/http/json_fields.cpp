// Typed JSON field reads (json_fields.h).
#include "daemon/http/json_fields.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace kestrel::daemon::http {
namespace {

std::string number_text(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

std::string json_type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    case Json::value_t::binary:
    case Json::value_t::discarded: break;
  }
  return "a value";
}

std::string describe_value(const Json& v) {
  if (v.is_null()) return "null";
  std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text + " (" + json_type_name(v) + ")";
}

FieldError read_bool(const Json& v, const std::string& param, bool* out) {
  if (!v.is_boolean()) return ApiError::invalid(param, param + " must be true or false, got " + describe_value(v));
  *out = v.get<bool>();
  return std::nullopt;
}

FieldError read_int(const Json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out) {
  auto range = [&] {
    return ApiError::invalid(param, param + " must be an integer from " + std::to_string(lo) + " to " +
                                        std::to_string(hi) + ", got " + describe_value(v));
  };
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return range();
    const auto i = static_cast<int64_t>(u);
    if (i < lo || i > hi) return range();
    *out = i;
    return std::nullopt;
  }
  if (!v.is_number_integer()) return range();
  const auto i = v.get<int64_t>();
  if (i < lo || i > hi) return range();
  *out = i;
  return std::nullopt;
}

FieldError read_number(const Json& v, const std::string& param, double lo, double hi, double* out) {
  if (!v.is_number()) {
    return ApiError::invalid(param, param + " must be a number, got " + describe_value(v));
  }
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    std::string range;
    if (std::isfinite(lo) && std::isfinite(hi)) {
      range = " from " + number_text(lo) + " to " + number_text(hi);
    } else if (std::isfinite(lo)) {
      range = " >= " + number_text(lo);
    } else if (std::isfinite(hi)) {
      range = " <= " + number_text(hi);
    }
    return ApiError::invalid(param, param + " must be a finite number" + range + ", got " + describe_value(v));
  }
  *out = d;
  return std::nullopt;
}

FieldError read_string(const Json& v, const std::string& param, std::string* out) {
  if (!v.is_string()) return ApiError::invalid(param, param + " must be a string, got " + describe_value(v));
  *out = v.get<std::string>();
  return std::nullopt;
}

FieldError require_object(const Json& v, const std::string& param) {
  if (!v.is_object()) return ApiError::invalid(param, param + " must be an object, got " + describe_value(v));
  return std::nullopt;
}

}  // namespace kestrel::daemon::http
