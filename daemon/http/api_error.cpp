// ApiError (api_error.h).
#include "daemon/http/api_error.h"

#include <nlohmann/json.hpp>
#include <utility>

namespace kestrel::daemon::http {

ApiError ApiError::invalid(std::string param, std::string message, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError ApiError::unsupported(std::string param, std::string message) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), "unsupported_parameter"};
}

ApiError ApiError::from_error(const Error& error) {
  ApiError e;
  e.message = error.message;
  switch (error.code) {
    case ErrorCode::kInvalidArgument: break;
    case ErrorCode::kOutOfRange: e.code = "context_length_exceeded"; break;
    case ErrorCode::kUnsupported: e.code = "unsupported_parameter"; break;
    case ErrorCode::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case ErrorCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case ErrorCode::kFailedPrecondition:
      e.status = 409;
      e.type = "conflict_error";
      break;
    case ErrorCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "timeout_error";
      break;
    case ErrorCode::kCancelled:
      e.status = 499;
      e.type = "cancelled";
      break;
    case ErrorCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable_error";
      break;
    case ErrorCode::kIo:
    case ErrorCode::kDataLoss:
    case ErrorCode::kInternal:
      e.status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

namespace {

// `text` cut to at most `max` bytes at a character boundary, saying how much was left out.
std::string bounded(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return text.substr(0, cut) + " [" + std::to_string(text.size() - cut) + " more bytes]";
}

}  // namespace

std::string error_body(const ApiError& error) {
  using Json = nlohmann::ordered_json;  // message, type, param, code: OpenAI's order
  Json inner = {{"message", bounded(error.message, kMaxErrorMessageBytes)}, {"type", error.type}};
  inner["param"] = error.param.empty() ? Json(nullptr) : Json(bounded(error.param, kMaxErrorParamBytes));
  inner["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  return Json{{"error", std::move(inner)}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace kestrel::daemon::http
