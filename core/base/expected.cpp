#include "core/base/expected.h"

namespace kestrel {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kDataLoss: return "data loss";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kFailedPrecondition: return "failed precondition";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kDeadlineExceeded: return "deadline exceeded";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

std::string Error::to_string() const { return std::string(error_code_name(code)) + ": " + message; }

}  // namespace kestrel
