// Client::connect: parses the URI (client.h lists the schemes) and hands it to the transport that serves it.
#include "client/lib/client.h"

#include <string_view>

#include "client/lib/transports.h"
#include "proto/kestrel/grpc_codes.h"

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

ErrorCode error_code_from_grpc(int code) {
  switch (code) {
    case grpc_code::kCancelled: return ErrorCode::kCancelled;
    case grpc_code::kInvalidArgument: return ErrorCode::kInvalidArgument;
    case grpc_code::kDeadlineExceeded: return ErrorCode::kDeadlineExceeded;
    case grpc_code::kNotFound: return ErrorCode::kNotFound;
    case grpc_code::kResourceExhausted: return ErrorCode::kResourceExhausted;
    case grpc_code::kFailedPrecondition: return ErrorCode::kFailedPrecondition;
    case grpc_code::kAborted: return ErrorCode::kCancelled;
    case grpc_code::kOutOfRange: return ErrorCode::kOutOfRange;
    case grpc_code::kUnimplemented: return ErrorCode::kUnsupported;
    case grpc_code::kUnavailable: return ErrorCode::kUnavailable;
    case grpc_code::kDataLoss: return ErrorCode::kDataLoss;
    default: return ErrorCode::kInternal;  // UNKNOWN, INTERNAL, PERMISSION_DENIED, ...
  }
}

}  // namespace kestrel::client
