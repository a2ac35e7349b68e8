// Control-socket helpers of the shm fast path (control_socket.h).
#include "kestrel/shm/control_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace kestrel::shm {
namespace {

Expected<sockaddr_un> unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return make_error(ErrorCode::kInvalidArgument, "control socket path '" + path + "' is empty or longer than " +
                                                       std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

}  // namespace

std::string errno_text(int err) { return std::error_code(err, std::system_category()).message(); }

ControlMessage make_control(ControlType type, const std::string& message, int32_t status) {
  ControlMessage m;
  m.type = type;
  m.status = status;
  const size_t n = std::min(message.size(), sizeof(m.message) - 1);
  std::memcpy(m.message, message.data(), n);
  return m;
}

Status send_control(int socket_fd, const ControlMessage& message, int pass_fd) {
  iovec iov{const_cast<ControlMessage*>(&message), sizeof(message)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  for (;;) {
    const ssize_t n = sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(message))) return ok_status();
    if (n < 0 && errno == EINTR) continue;
    const int err = errno;
    if (n < 0 && (err == EPIPE || err == ECONNRESET || err == ENOTCONN)) {
      return make_error(ErrorCode::kUnavailable, "shm control socket: peer closed the connection");
    }
    return make_error(ErrorCode::kIo, "shm control socket: sendmsg failed: " + (n < 0 ? errno_text(err) : "short"));
  }
}

Expected<ControlMessage> recv_control(int socket_fd, int* received_fd, std::chrono::milliseconds timeout) {
  if (received_fd != nullptr) *received_fd = -1;
  pollfd p{socket_fd, POLLIN, 0};
  for (;;) {
    const int r = poll(&p, 1, timeout.count() > 0 ? static_cast<int>(timeout.count()) : -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return make_error(ErrorCode::kIo, "shm control socket: poll failed: " + errno_text(errno));
    if (r == 0) {
      return make_error(ErrorCode::kDeadlineExceeded,
                        "shm control socket: no message within " + std::to_string(timeout.count()) + " ms");
    }
    break;
  }
  ControlMessage message;
  iovec iov{&message, sizeof(message)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  // Take every fd that came along first, so that none leaks whatever else is wrong with the message.
  int fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fd < 0 && received_fd != nullptr) {
        fd = got;
      } else {
        close(got);
      }
    }
  }
  const auto fail = [&](Error e) -> Expected<ControlMessage> {
    if (fd >= 0) close(fd);
    return e;
  };
  if (n == 0) return fail(make_error(ErrorCode::kUnavailable, "shm control socket: peer closed the connection"));
  if (n < 0) {
    const int err = errno;
    if (err == ECONNRESET) {
      return fail(make_error(ErrorCode::kUnavailable, "shm control socket: peer closed the connection"));
    }
    return fail(make_error(ErrorCode::kIo, "shm control socket: recvmsg failed: " + errno_text(err)));
  }
  if (n != static_cast<ssize_t>(sizeof(message)) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    return fail(make_error(ErrorCode::kDataLoss, "shm control socket: message of " + std::to_string(n) +
                                                     " bytes, expected " + std::to_string(sizeof(message))));
  }
  if (message.magic != kControlMagic || message.version != kControlVersion) {
    return fail(make_error(ErrorCode::kDataLoss,
                           "shm control socket: bad magic or protocol version " + std::to_string(message.version)));
  }
  message.message[sizeof(message.message) - 1] = '\0';
  if (received_fd != nullptr) *received_fd = fd;
  return message;
}

Expected<int> listen_control_socket(const std::string& path, uint32_t mode, int backlog) {
  KESTREL_TRY_ASSIGN(const sockaddr_un addr, unix_address(path));
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return make_error(ErrorCode::kFailedPrecondition, "shm control socket path '" + path +
                                                            "' exists and is not a socket; remove it or choose "
                                                            "another path");
    }
    if (unlink(path.c_str()) != 0) {
      return make_error(ErrorCode::kIo, "cannot remove the stale socket '" + path + "': " + errno_text(errno));
    }
  }
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(ErrorCode::kIo, "socket(AF_UNIX) failed: " + errno_text(errno));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return make_error(ErrorCode::kIo, "cannot bind the shm control socket '" + path + "': " + errno_text(err));
  }
  if (chmod(path.c_str(), mode) != 0 || listen(fd, backlog) != 0) {
    const int err = errno;
    close(fd);
    unlink(path.c_str());
    return make_error(ErrorCode::kIo, "cannot set up the shm control socket '" + path + "': " + errno_text(err));
  }
  return fd;
}

Expected<int> connect_control_socket(const std::string& path) {
  KESTREL_TRY_ASSIGN(const sockaddr_un addr, unix_address(path));
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(ErrorCode::kIo, "socket(AF_UNIX) failed: " + errno_text(errno));
  int r;
  do {
    r = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int err = errno;
    close(fd);
    return make_error(ErrorCode::kUnavailable,
                      "cannot connect to the kestreld shm control socket '" + path + "': " + errno_text(err));
  }
  return fd;
}

}  // namespace kestrel::shm
