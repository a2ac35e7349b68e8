// Fuzz target for the shm control socket (proto/kestrel/shm/control_socket.h): recv_control() reading whatever a
// peer sends as one SOCK_SEQPACKET message, with 0-3 file descriptors attached, as the daemon reads a client's
// "mapped" message and a client reads the daemon's hello or refusal.
//
// Input: [flags u8: bits 0-1 fds to attach, bit 2 the reader takes an fd, bit 3 the body is make_control()'s text
// instead of raw bytes][type u16, status i32 when bit 3][body...]. Invariants: a message is accepted only when it is
// exactly 256 bytes with the magic and version, its text is NUL-terminated inside its 224 bytes, the reader gets an
// fd exactly when it asked and one came, every error is kDataLoss / kUnavailable / kIo with a message (never a
// timeout: the message is there), no descriptor leaks (the process's open fds are counted), and make_control() text
// comes back as sent, cut to 223 bytes. Built as fuzz_shm_control (libFuzzer) and fuzz_shm_control_smoke.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>

#include "kestrel/shm/control_socket.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace kestrel;
using kestrel::fuzz::fuzz_check;

void check(bool ok, const char* what) { fuzz_check(ok, "fuzz_shm_control", what); }

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Sends `body` as one message on `fd` with `n_fds` copies of `passed` attached.
bool send_raw(int fd, std::string_view body, int n_fds, int passed) {
  iovec iov{const_cast<char*>(body.data()), body.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 3)] = {};
  if (n_fds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<size_t>(n_fds));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<size_t>(n_fds));
    for (int i = 0; i < n_fds; ++i) std::memcpy(CMSG_DATA(c) + i * sizeof(int), &passed, sizeof(int));
  }
  return sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(body.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  static int passed = open("/dev/null", O_RDONLY | O_CLOEXEC);
  fuzz::FuzzInput in(bytes, size);
  const uint8_t flags = in.u8();
  const int n_fds = flags & 3;
  const bool take_fd = (flags & 4) != 0;
  std::string body;
  std::string text;
  if ((flags & 8) != 0) {
    const auto type = static_cast<shm::ControlType>(in.u16());
    const auto status = static_cast<int32_t>(in.u32());
    text = std::string(in.bytes(1024));
    const shm::ControlMessage m = shm::make_control(type, text, status);
    body.assign(reinterpret_cast<const char*>(&m), sizeof m);
  } else {
    body = std::string(in.bytes(4096));
  }
  int sv[2];
  check(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
  const size_t fds_before = open_fds();
  check(send_raw(sv[0], body, n_fds, passed), "the message is sent");
  int received = -2;
  auto got = shm::recv_control(sv[1], take_fd ? &received : nullptr, std::chrono::milliseconds(1000));
  if (got) {
    check(body.size() == sizeof(shm::ControlMessage), "only 256-byte messages are accepted");
    check(got->magic == shm::kControlMagic && got->version == shm::kControlVersion, "magic and version are checked");
    check(std::memchr(got->message, '\0', sizeof got->message) != nullptr, "the text is NUL-terminated");
    if (take_fd) {
      check((received >= 0) == (n_fds > 0), "an fd is returned exactly when one came");
      if (received >= 0) close(received);
    }
    if ((flags & 8) != 0) {
      check(std::string(got->message) ==
                text.substr(0, std::min(text.size(), sizeof got->message - 1)).substr(0, text.find('\0')),
            "make_control text comes back as sent, cut to 223 bytes");
    }
  } else {
    check(!got.error().message.empty(), "errors carry a message");
    check(got.error().code == ErrorCode::kDataLoss || got.error().code == ErrorCode::kUnavailable ||
              got.error().code == ErrorCode::kIo,
          "errors are kDataLoss, kUnavailable or kIo");
    if (take_fd) check(received == -1, "no fd is returned with an error");
  }
  check(open_fds() == fds_before, "no descriptor leaks");
  close(sv[0]);
  close(sv[1]);
  return 0;
}
