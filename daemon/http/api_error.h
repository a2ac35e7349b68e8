// ApiError: an error answered at the HTTP edge, in OpenAI's shape (docs/http.md "Errors"):
//
//   HTTP 400  {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": "unsupported_value"}}
//
// `param` and `code` are null when empty. from_error() maps the Service's kestrel::Error codes onto HTTP statuses the
// way the gRPC edge maps them onto status codes (docs/api.md): bad input 400, unknown thing 404, a full limit 429,
// loading or draining 503, a bug 500. Plain values; thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "core/base/expected.h"

namespace kestrel::daemon::http {

struct ApiError {
  int status = 400;  // the HTTP status
  std::string message;
  std::string type = "invalid_request_error";  // invalid_request_error, authentication_error, not_found_error,
                                               // rate_limit_error, server_error, service_unavailable_error
  std::string param;                           // the request field at fault; "" = null
  std::string code;                            // a machine-readable reason; "" = null

  // 400: a field has the wrong type, an impossible value, or is missing.
  static ApiError invalid(std::string param, std::string message, std::string code = "invalid_value");
  // 400: a well-formed request for something kestreld does not do (n > 1, tools, response_format, ...).
  static ApiError unsupported(std::string param, std::string message);
  // The Service's error for this request: kInvalidArgument 400, kOutOfRange 400 (context_length_exceeded),
  // kUnsupported 400, kNotFound 404, kResourceExhausted 429, kFailedPrecondition 409, kDeadlineExceeded 504,
  // kCancelled 499 (the client is gone; nobody reads it), kUnavailable 503, kIo / kDataLoss / kInternal 500.
  static ApiError from_error(const Error& error);
};

// The JSON body of an error response (one line, no newline). Messages and params quote what the client sent (a key,
// a path, a model name), so they are cut to these many bytes (with "[N more bytes]") to keep an error's size bounded
// whatever the request held.
inline constexpr size_t kMaxErrorMessageBytes = 1024;
inline constexpr size_t kMaxErrorParamBytes = 256;
std::string error_body(const ApiError& error);

}  // namespace kestrel::daemon::http
