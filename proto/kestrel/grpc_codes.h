// grpc_codes.h: the gRPC status code numbers (grpc::StatusCode's values, fixed by the gRPC protocol) and their names,
// spelled out once for both sides of the wire: the daemon's handlers and the shm transport (which carry codes without
// a gRPC header) and the client library (which turns them back into kestrel::Error). Header-only.
#pragma once

#include <iterator>

namespace kestrel::grpc_code {

inline constexpr int kOk = 0;
inline constexpr int kCancelled = 1;
inline constexpr int kUnknown = 2;
inline constexpr int kInvalidArgument = 3;
inline constexpr int kDeadlineExceeded = 4;
inline constexpr int kNotFound = 5;
inline constexpr int kAlreadyExists = 6;
inline constexpr int kPermissionDenied = 7;
inline constexpr int kResourceExhausted = 8;
inline constexpr int kFailedPrecondition = 9;
inline constexpr int kAborted = 10;
inline constexpr int kOutOfRange = 11;
inline constexpr int kUnimplemented = 12;
inline constexpr int kInternal = 13;
inline constexpr int kUnavailable = 14;
inline constexpr int kDataLoss = 15;
inline constexpr int kUnauthenticated = 16;

// "NOT_FOUND" for 5, ...; "UNKNOWN" for numbers outside 0..16.
inline const char* name(int code) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) return "UNKNOWN";
  return kNames[code];
}

}  // namespace kestrel::grpc_code
