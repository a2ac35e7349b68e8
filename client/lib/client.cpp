// Client::connect: parses the URI (client.h lists the schemes) and hands it to the transport that serves it.
#include "client/lib/client.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>

#include "client/lib/transports.h"
#include "proto/kestrel/grpc_codes.h"

namespace kestrel::client {
namespace {

// A Unix socket that does not exist, or that nothing listens on, fails here at once: gRPC itself would retry until
// connect_timeout. The messages state what was found; callers add advice (the CLI says how to start or find kestreld).
Status probe_unix_socket(const std::string& uri, const std::string& path) {
  auto fail = [&](const std::string& why) {
    return make_error(ErrorCode::kUnavailable, "could not connect to " + uri + ": " + why);
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return fail(err == ENOENT ? "there is no socket at " + path : path + ": " + std::generic_category().message(err));
  }
  if (!S_ISSOCK(st.st_mode)) return fail(path + " is not a socket");
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return fail("the path is longer than a Unix socket path may be");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(std::string("socket(AF_UNIX): ") + std::generic_category().message(errno));
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (rc == 0) return ok_status();
  if (err == ECONNREFUSED) return fail("nothing listens on " + path + " (a socket left behind by a stopped kestreld)");
  return fail(path + ": " + std::generic_category().message(err));
}

}  // namespace

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
    KESTREL_TRY(probe_unix_socket(uri, path));
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
