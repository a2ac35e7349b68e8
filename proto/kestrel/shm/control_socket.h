// The control socket of the shm fast path (docs/shm.md "Handshake"): fixed-size messages over a Unix
// SOCK_SEQPACKET socket, the segment's file descriptor passed with SCM_RIGHTS. Both sides use these helpers.
//
// Ownership: file descriptors returned here belong to the caller (close them). Threading: plain functions; one
// thread per socket at a time for recv.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/base/expected.h"

namespace kestrel::shm {

inline constexpr uint32_t kControlMagic = 0x434D534Bu;  // "KSMC"
inline constexpr uint16_t kControlVersion = 1;

enum ControlType : uint16_t {
  kControlHello = 1,    // daemon → client, with the segment fd (SCM_RIGHTS) and its size
  kControlMapped = 2,   // client → daemon: the segment is mapped and its header checked; serving may start
  kControlRefused = 3,  // daemon → client: status (gRPC code) + message; the daemon closes the socket after it
};

struct ControlMessage {
  uint32_t magic = kControlMagic;
  uint16_t version = kControlVersion;
  uint16_t type = 0;
  int32_t status = 0;  // gRPC code for kControlRefused
  uint32_t reserved = 0;
  uint64_t segment_size = 0;
  uint64_t owner_tag = 0;
  char message[224] = {};  // NUL-terminated UTF-8
};
static_assert(sizeof(ControlMessage) == 256);

ControlMessage make_control(ControlType type, const std::string& message = {}, int32_t status = 0);

// Sends one message, with `pass_fd` attached when >= 0. kIo / kUnavailable (peer gone) on failure.
Status send_control(int socket_fd, const ControlMessage& message, int pass_fd = -1);

// Receives one message within `timeout` (0 = wait forever). A received fd goes to *received_fd (or -1; extra fds
// are closed). kUnavailable on EOF, kDeadlineExceeded on timeout, kDataLoss on a message of the wrong size, magic
// or version.
Expected<ControlMessage> recv_control(int socket_fd, int* received_fd, std::chrono::milliseconds timeout);

// A listening SOCK_SEQPACKET socket at `path`: a stale socket file there is removed first (any other kind of file
// is an error), the new one gets `mode` (e.g. 0660).
Expected<int> listen_control_socket(const std::string& path, uint32_t mode, int backlog = 64);
// Connects to the daemon's control socket.
Expected<int> connect_control_socket(const std::string& path);

// strerror's text for `err`, thread-safe.
std::string errno_text(int err);

}  // namespace kestrel::shm
