// Client::connect: parses the URI (client.h lists the schemes) and hands it to the transport that serves it.
#include "client/lib/client.h"

#include <string_view>

#include "client/lib/transports.h"

namespace kestrel::client {

Expected<std::unique_ptr<Client>> Client::connect(const std::string& uri, const ClientOptions& options) {
  constexpr std::string_view kUnix = "unix://";
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kShm = "shm://";
  const std::string_view u(uri);
  if (u.starts_with(kUnix)) {
    const std::string path(u.substr(kUnix.size()));
    if (path.empty() || path[0] != '/') {
      return make_error(ErrorCode::kInvalidArgument,
                        "'" + uri + "': a unix URI needs an absolute path (unix:///run/...)");
    }
    return make_grpc_client("unix://" + path, "grpc-unix", options);
  }
  if (u.starts_with(kTcp)) {
    const std::string hostport(u.substr(kTcp.size()));
    const auto colon = hostport.rfind(':');
    if (hostport.empty() || colon == std::string::npos || colon == 0 || colon + 1 == hostport.size()) {
      return make_error(ErrorCode::kInvalidArgument, "'" + uri + "': a tcp URI needs host:port (tcp://127.0.0.1:7777)");
    }
    return make_grpc_client(hostport, "grpc-tcp", options);
  }
  if (u.starts_with(kShm)) {
    const std::string path(u.substr(kShm.size()));
    if (path.empty() || path[0] != '/') {
      return make_error(ErrorCode::kInvalidArgument,
                        "'" + uri + "': a shm URI needs the control socket's absolute path (shm:///run/...)");
    }
    return make_shm_client(path, options);
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "'" + uri + "': unknown transport; use unix:///path, tcp://host:port or shm:///path");
}

ErrorCode error_code_from_grpc(int grpc_code) {
  switch (grpc_code) {
    case 1: return ErrorCode::kCancelled;           // CANCELLED
    case 3: return ErrorCode::kInvalidArgument;     // INVALID_ARGUMENT
    case 4: return ErrorCode::kDeadlineExceeded;    // DEADLINE_EXCEEDED
    case 5: return ErrorCode::kNotFound;            // NOT_FOUND
    case 8: return ErrorCode::kResourceExhausted;   // RESOURCE_EXHAUSTED
    case 9: return ErrorCode::kFailedPrecondition;  // FAILED_PRECONDITION
    case 10: return ErrorCode::kCancelled;          // ABORTED
    case 11: return ErrorCode::kOutOfRange;         // OUT_OF_RANGE
    case 12: return ErrorCode::kUnsupported;        // UNIMPLEMENTED
    case 14: return ErrorCode::kUnavailable;        // UNAVAILABLE
    case 15: return ErrorCode::kDataLoss;           // DATA_LOSS
    default: return ErrorCode::kInternal;           // UNKNOWN, INTERNAL, PERMISSION_DENIED, ...
  }
}

}  // namespace kestrel::client
