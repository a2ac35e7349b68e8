// ShmServer: kestreld's shared-memory fast path, server side (docs/shm.md). It listens on a Unix control socket
// (SOCK_SEQPACKET); for each client it reads the peer's credentials (SO_PEERCRED; optional allow-list of uids), takes
// a handshake place (shm_admission.h: limited overall and per uid, promoted to a client slot once the client has
// mapped its segment), creates a private segment (sealed memfd, see shm_segment.h) and passes its fd with SCM_RIGHTS,
// then serves the client's request ring through RpcHandlers on a thread of that connection (shm_connection.h). Sessions
// created by a client carry its connection's owner tag; when the client goes, they are closed and its segment is
// unmapped.
//
// Wiring (kestreld main):
//   KESTREL_TRY_ASSIGN(auto shm, ShmServer::start(options, service, handlers));
//   ...                         // serve; ServerStatus.shm_clients follows client_count() through handlers
//   service.drain(deadline);    // SIGTERM: in-flight shm streams finish through their connections meanwhile
//   shm->stop();                // then: ends every connection (clients see UNAVAILABLE), closes their sessions
//
// Ownership: borrows service and handlers, which must outlive the ShmServer. Owns the listening socket (its file is
// removed by stop()), the acceptor thread and one thread per client.
// Threading: start/stop/destructor from one thread; the accessors from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/expected.h"
#include "daemon/engine/service.h"
#include "daemon/server/rpc_handlers.h"
#include "daemon/shm/log_throttle.h"
#include "daemon/shm/shm_admission.h"

namespace kestrel::daemon {

struct ShmServerOptions {
  std::string socket_path;          // the control socket, e.g. /run/kestrel/kestreld-shm.sock (clients: shm:///run/...)
  uint32_t socket_mode = 0660;      // who may connect: the daemon's user and group
  std::vector<uid_t> allowed_uids;  // empty: any peer the socket mode lets in; else only these uids (and root)
  // Client slots and handshake places (shm_admission.h); over a limit a connection is refused with
  // RESOURCE_EXHAUSTED. Connections still in their handshake never hold one of max_clients.
  ShmAdmissionLimits admission;
  size_t max_queued_response_bytes = 8u << 20;  // per client; past it generations are aborted (client not reading)
  // From accept to the client's "mapped" message; a connection silent for longer is dropped.
  std::chrono::milliseconds handshake_timeout{2000};
  // Refused connections and failed handshakes: at most this many warnings per period, the rest summarised.
  uint32_t refusal_log_burst = 5;
  std::chrono::milliseconds refusal_log_period{10000};
};

class ShmConnection;

class ShmServer {
 public:
  // Binds the control socket (a stale socket file at the path is replaced; any other file is an error) and starts
  // accepting. kInvalidArgument (bad path), kFailedPrecondition / kIo (cannot bind) with the path and the reason.
  static Expected<std::unique_ptr<ShmServer>> start(ShmServerOptions options, Service& service, RpcHandlers& handlers);
  ~ShmServer();  // stop()
  ShmServer(const ShmServer&) = delete;
  ShmServer& operator=(const ShmServer&) = delete;

  // Stops accepting, ends every connection (their sessions are closed, clients see UNAVAILABLE), joins the threads
  // and removes the socket file. Idempotent.
  void stop();

  // Clients connected now (handshake done), and connections still in their handshake.
  uint32_t client_count() const { return admission_.clients(); }
  uint32_t handshake_count() const { return admission_.handshakes(); }
  // Refusal and handshake-failure warnings not logged one by one so far.
  uint64_t suppressed_warnings() const { return refusals_.suppressed_total(); }
  const std::string& socket_path() const { return options_.socket_path; }

 private:
  ShmServer(ShmServerOptions options, Service& service, RpcHandlers& handlers, int listen_fd, int wake_fd);
  void accept_loop();
  void admit(int fd);
  void reap(bool all);
  // Sends the refusal to the peer, closes fd and logs it (throttled).
  void refuse(int fd, const std::string& peer, int code, const std::string& message);

  struct Client {
    std::shared_ptr<ShmConnection> connection;
    std::thread thread;
  };

  ShmServerOptions options_;
  Service& service_;
  RpcHandlers& handlers_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that wakes the acceptor for stop()
  std::thread acceptor_;
  std::mutex mu_;
  std::list<Client> connections_;  // guarded by mu_
  ShmAdmission admission_;
  LogThrottle refusals_;
  std::atomic<uint64_t> next_owner_{1};
  bool stopped_ = false;
};

}  // namespace kestrel::daemon
