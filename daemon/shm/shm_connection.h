// ShmConnection: one shm client of kestreld, from handshake to cleanup (docs/shm.md). Internal to daemon/shm;
// ShmServer creates one per accepted control-socket connection and runs run() on a thread of its own.
//
// The connection thread is the only consumer of the request ring and the only producer of the response ring. It
// parses each request (copied out of the ring first, then validated), calls RpcHandlers, and writes responses. The
// engine thread's callbacks never touch the rings: they push records into this connection's Outbox (a daemon-private
// queue, bounded) and ring the connection thread's doorbell. When the client goes (EOF or error on the control
// socket, its liveness word set to closed, or a corrupt ring) the thread cancels its generations, closes every
// session the client owned (Service::close_owned_by), tells the client why over the control socket when it still
// can, and drops the segment (unmapped once the last pending engine callback has let go of it).
//
// Threading: run() on one thread; request_stop() and the accessors from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "daemon/engine/service.h"
#include "daemon/server/rpc_handlers.h"
#include "daemon/shm/log_throttle.h"
#include "daemon/shm/shm_admission.h"
#include "daemon/shm/shm_outbox.h"
#include "daemon/shm/shm_segment.h"
#include "kestrel/shm/spsc_ring.h"

namespace kestrel::daemon {

struct ShmPeer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct ShmConnectionOptions {
  size_t max_queued_response_bytes = 8u << 20;
  std::chrono::milliseconds handshake_timeout{2000};
  std::chrono::milliseconds idle_check{100};           // how often an idle connection looks at its control socket
  std::chrono::milliseconds stop_flush_timeout{1000};  // on stop: time to write the answers already queued
};

class ShmConnection {
 public:
  // Takes ownership of socket_fd. The connection holds a handshake place in `admission` (taken by the caller):
  // run() promotes it to a client slot when the handshake succeeds, or gives it back, and releases the client slot
  // at the end. Failed handshakes are logged through `refusals`. Borrows everything else; all must outlive run().
  ShmConnection(int socket_fd, ShmPeer peer, uint64_t owner, Service& service, RpcHandlers& handlers,
                ShmAdmission& admission, LogThrottle& refusals, ShmConnectionOptions options);
  ~ShmConnection();
  ShmConnection(const ShmConnection&) = delete;
  ShmConnection& operator=(const ShmConnection&) = delete;

  // Handshake, then serve until the client goes or request_stop(); then clean up. Returns when all is released.
  void run();
  void request_stop();
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  uint64_t owner() const { return owner_; }
  const ShmPeer& peer() const { return peer_; }

 private:
  Status handshake();
  // Serves until the client goes; returns the reason (for the log and the client).
  Error serve();
  // Parses and dispatches one request record; a malformed request gets an error record. kDataLoss only for a
  // protocol violation that makes the connection unusable.
  void handle(const shm::Record& record);
  void reply_error(uint64_t request_id, int code, std::string message);
  void reply(uint64_t request_id, shm::Op op, const google::protobuf::MessageLite& message);
  // Writes queued responses into the ring while there is room. Returns whether anything was written.
  Expected<bool> flush();
  bool control_socket_closed();
  // Ends the connection: cancels its streams, closes its sessions, tells the client why. `served`: it got past the
  // handshake (then the end is logged; a failed handshake is logged by run(), throttled).
  void cleanup(const Error& reason, bool served);
  Error finish_on_stop();

  int socket_fd_;
  ShmPeer peer_;
  uint64_t owner_;
  Service& service_;
  RpcHandlers& handlers_;
  ShmAdmission& admission_;
  LogThrottle& refusals_;
  ShmConnectionOptions options_;
  std::string name_;  // "shm client pid 123 uid 1000" for logs

  std::shared_ptr<ShmSegment> segment_;
  std::shared_ptr<ShmOutbox> outbox_;
  shm::RingConsumer requests_;
  shm::RingProducer responses_;
  std::deque<ShmOutRecord> pending_;  // taken from the outbox, not yet in the ring (connection thread)
  std::unordered_map<uint64_t, std::shared_ptr<ShmGenerateSink>> generations_;  // in flight (connection thread)
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::mutex wake_mu_;
  std::shared_ptr<ShmOutbox> wake_target_;  // guarded by wake_mu_: what request_stop() rings
};

}  // namespace kestrel::daemon
