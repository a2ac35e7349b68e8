// Typed reads of one field of a JSON request body, each failing with an ApiError (400) that names the field, says
// what it must be and what it was: "max_tokens must be an integer from 1 to 2147483647, got \"ten\" (a string)".
//
// `param` is the field's path as the client wrote it ("temperature", "messages[2].content"). Pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "daemon/http/api_error.h"

namespace kestrel::daemon::http {

// Request bodies keep the client's key order, as Python's json does: the chat template writes tool-call arguments with
// tojson in that order (core/chat/chat_template.h), so the rendered prompt matches transformers byte for byte.
using Json = nlohmann::ordered_json;
using FieldError = std::optional<ApiError>;  // nullopt: the field was read

// "a string", "an array", "null", ... for messages.
std::string json_type_name(const Json& v);
// The value as the client wrote it, shortened to about 60 bytes, with its type: "\"ten\" (a string)".
std::string describe_value(const Json& v);

FieldError read_bool(const Json& v, const std::string& param, bool* out);
// An integer (a JSON number without fraction or exponent) in [lo, hi].
FieldError read_int(const Json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out);
// A finite number (integers included) in [lo, hi].
FieldError read_number(const Json& v, const std::string& param, double lo, double hi, double* out);
FieldError read_string(const Json& v, const std::string& param, std::string* out);
// Fails unless v is an object.
FieldError require_object(const Json& v, const std::string& param);

}  // namespace kestrel::daemon::http
