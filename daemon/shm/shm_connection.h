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
#include "daemon/shm/shm_segment.h"
#include "kestrel/shm/spsc_ring.h"

namespace kestrel::daemon {

struct ShmPeer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// A record waiting to be written into the response ring.
struct ShmOutRecord {
  shm::RecordHeader header{};
  std::string payload;
};

// Daemon-side response queue of one connection: filled by the engine thread (and the connection thread), drained
// into the response ring by the connection thread. Thread-safe.
class ShmOutbox {
 public:
  ShmOutbox(std::shared_ptr<ShmSegment> segment, size_t max_bytes)
      : segment_(std::move(segment)), max_bytes_(max_bytes) {}

  // Queues a record and wakes the connection thread. `bounded`: refuse (return false) when more than max_bytes are
  // queued already (generation chunks); final records are always queued so that every request gets its answer.
  // Returns false (and drops the record) once the connection is closed.
  bool push(ShmOutRecord record, bool bounded);
  // Moves every queued record to the back of *out (connection thread).
  void take_all(std::deque<ShmOutRecord>* out);
  void record_written(size_t bytes) { queued_bytes_.fetch_sub(bytes, std::memory_order_relaxed); }
  size_t queued_bytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  bool has_new() const { return has_new_.load(std::memory_order_acquire); }
  size_t max_bytes() const { return max_bytes_; }
  void close();
  void wake() const;

 private:
  std::shared_ptr<ShmSegment> segment_;  // kept mapped while a callback may still ring its doorbell
  const size_t max_bytes_;
  std::mutex mu_;
  std::deque<ShmOutRecord> queue_;  // guarded by mu_
  bool closed_ = false;             // guarded by mu_
  std::atomic<size_t> queued_bytes_{0};
  std::atomic<bool> has_new_{false};
};

struct ShmConnectionOptions {
  size_t max_queued_response_bytes = 8u << 20;
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds idle_check{100};           // how often an idle connection looks at its control socket
  std::chrono::milliseconds stop_flush_timeout{1000};  // on stop: time to write the answers already queued
};

class ShmGenerateSink;

class ShmConnection {
 public:
  // Takes ownership of socket_fd.
  ShmConnection(int socket_fd, ShmPeer peer, uint64_t owner, Service& service, RpcHandlers& handlers,
                ShmConnectionOptions options);
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
  void cleanup(const Error& reason);
  Error finish_on_stop();

  int socket_fd_;
  ShmPeer peer_;
  uint64_t owner_;
  Service& service_;
  RpcHandlers& handlers_;
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
