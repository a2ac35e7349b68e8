// ShmServer: the control socket's acceptor and the per-client connection threads (shm_server.h).
#include "daemon/shm/shm_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "daemon/shm/shm_connection.h"
#include "kestrel/shm/control_socket.h"

namespace kestrel::daemon {
namespace {

// Owner tags of shm connections: "KSHM" in the top 32 bits so that they never collide with small tags other
// transports may use, and a per-process counter below.
constexpr uint64_t kOwnerTagBase = 0x4B53484Dull << 32;

}  // namespace

Expected<std::unique_ptr<ShmServer>> ShmServer::start(ShmServerOptions options, Service& service,
                                                      RpcHandlers& handlers) {
  if (options.socket_path.empty() || options.socket_path[0] != '/') {
    return make_error(ErrorCode::kInvalidArgument,
                      "the shm control socket path must be absolute, got '" + options.socket_path + "'");
  }
  KESTREL_TRY_ASSIGN(const int listen_fd, shm::listen_control_socket(options.socket_path, options.socket_mode));
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int err = errno;
    close(listen_fd);
    unlink(options.socket_path.c_str());
    return make_error(ErrorCode::kIo, std::string("eventfd failed: ") + shm::errno_text(err));
  }
  std::unique_ptr<ShmServer> server(new ShmServer(std::move(options), service, handlers, listen_fd, wake_fd));
  server->acceptor_ = std::thread([s = server.get()] { s->accept_loop(); });
  spdlog::info("shm fast path listening on {} (mode {:o})", server->options_.socket_path, server->options_.socket_mode);
  return server;
}

ShmServer::ShmServer(ShmServerOptions options, Service& service, RpcHandlers& handlers, int listen_fd, int wake_fd)
    : options_(std::move(options)),
      service_(service),
      handlers_(handlers),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      admission_(options_.admission, [&handlers](uint32_t n) { handlers.set_shm_clients(n); }),
      refusals_("refused or failed shm connections", options_.refusal_log_burst, options_.refusal_log_period) {}

ShmServer::~ShmServer() { stop(); }

void ShmServer::stop() {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Client& c : connections_) c.connection->request_stop();
  }
  reap(/*all=*/true);
  close(listen_fd_);
  close(wake_fd_);
  unlink(options_.socket_path.c_str());
  spdlog::info("shm fast path stopped ({})", options_.socket_path);
}

void ShmServer::accept_loop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    const int r = poll(fds, 2, 1000);
    if (r < 0 && errno != EINTR) {
      spdlog::error("shm control socket: poll failed: {}; no new shm clients are accepted", shm::errno_text(errno));
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;
    reap(/*all=*/false);
    refusals_.flush();
    if (r <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        spdlog::warn("shm control socket: accept failed: {}", shm::errno_text(errno));
        if (errno == EMFILE || errno == ENFILE) poll(nullptr, 0, 100);  // let descriptors free up
      }
      continue;
    }
    admit(fd);
  }
}

void ShmServer::refuse(int fd, const std::string& peer, int code, const std::string& message) {
  (void)shm::send_control(fd, shm::make_control(shm::kControlRefused, message, code));
  close(fd);
  refusals_.warn(peer + " refused: " + message);
}

void ShmServer::admit(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    refuse(fd, "shm client", rpc_code::kInternal,
           "kestreld could not read the peer credentials (SO_PEERCRED: " + shm::errno_text(errno) + ")");
    return;
  }
  const ShmPeer peer{cred.pid, cred.uid, cred.gid};
  const std::string name = "shm client pid " + std::to_string(peer.pid) + " uid " + std::to_string(peer.uid);
  if (!options_.allowed_uids.empty() && peer.uid != 0 &&
      std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), peer.uid) == options_.allowed_uids.end()) {
    refuse(
        fd, name, rpc_code::kPermissionDenied,
        "uid " + std::to_string(peer.uid) + " may not use kestreld's shm fast path (it is not among the allowed uids)");
    return;
  }
  if (Status st = admission_.begin_handshake(peer.uid); !st) {
    refuse(fd, name, to_rpc_status(st.error()).code, st.error().message);
    return;
  }
  ShmConnectionOptions copts;
  copts.max_queued_response_bytes = options_.max_queued_response_bytes;
  copts.handshake_timeout = options_.handshake_timeout;
  const uint64_t owner = kOwnerTagBase | next_owner_.fetch_add(1);
  auto connection = std::make_shared<ShmConnection>(fd, peer, owner, service_, handlers_, admission_, refusals_, copts);
  std::lock_guard<std::mutex> lock(mu_);
  connections_.push_back(Client{connection, std::thread([connection] { connection->run(); })});
}

void ShmServer::reap(bool all) {
  std::list<Client> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (all || it->connection->finished()) {
        done.splice(done.end(), connections_, it++);
      } else {
        ++it;
      }
    }
  }
  for (Client& c : done) c.thread.join();
}

}  // namespace kestrel::daemon
