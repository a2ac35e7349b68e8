// ShmOutbox: the daemon-side response queue of one shm connection, and ShmGenerateSink, one Generate stream writing
// into it (docs/shm.md "Trust rules"). The engine thread's callbacks never touch the rings: they push records here
// and ring the connection thread's doorbell; the connection thread moves them into the response ring.
//
// Bounded: generation chunks are refused once more than max_bytes are queued (the client is not reading); the
// stream is then aborted with RESOURCE_EXHAUSTED and one warning. Final records (every request's answer) are always
// queued. Once the connection ends the outbox is closed: pushes are dropped and the streams writing into it end
// quietly (a client that died is not one that stopped reading).
//
// Threading: ShmOutbox is thread-safe. A ShmGenerateSink's on_chunk/on_done run on the engine thread, cancel() on the
// connection thread, cancelled() anywhere. Ownership: both share the segment (its doorbell) until the last of them
// goes, so a late engine callback never rings an unmapped bell.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/server/rpc_handlers.h"
#include "daemon/shm/shm_segment.h"
#include "kestrel/shm/spsc_ring.h"

namespace kestrel::daemon {

// A record waiting to be written into the response ring.
struct ShmOutRecord {
  shm::RecordHeader header{};
  std::string payload;
};

// An error record answering `request_id` (final); the message is cut to 4096 bytes.
ShmOutRecord shm_error_record(uint64_t request_id, int code, std::string message);
// A response record of `op`, or an error record (RESOURCE_EXHAUSTED) when the serialized message is over the
// record limit.
ShmOutRecord shm_response_record(uint64_t request_id, shm::Op op, const google::protobuf::MessageLite& message,
                                 bool final);

enum class ShmPush {
  kQueued,
  kFull,    // bounded push refused: more than max_bytes are queued (the client does not read)
  kClosed,  // the connection has ended; the record was dropped
};

class ShmOutbox {
 public:
  ShmOutbox(std::shared_ptr<ShmSegment> segment, size_t max_bytes)
      : segment_(std::move(segment)), max_bytes_(max_bytes) {}

  // Queues a record and wakes the connection thread. `bounded` (generation chunks): refused with kFull when more
  // than max_bytes are queued already; final records are always queued so that every request gets its answer.
  ShmPush push(ShmOutRecord record, bool bounded);
  // Moves every queued record to the back of *out (connection thread).
  void take_all(std::deque<ShmOutRecord>* out);
  void record_written(size_t bytes) { queued_bytes_.fetch_sub(bytes, std::memory_order_relaxed); }
  size_t queued_bytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  bool has_new() const { return has_new_.load(std::memory_order_acquire); }
  size_t max_bytes() const { return max_bytes_; }
  // Drops what is queued; every later push answers kClosed.
  void close();
  bool closed() const { return closed_flag_.load(std::memory_order_acquire); }
  void wake() const;

 private:
  std::shared_ptr<ShmSegment> segment_;  // kept mapped while a callback may still ring its doorbell
  const size_t max_bytes_;
  std::mutex mu_;
  std::deque<ShmOutRecord> queue_;  // guarded by mu_
  bool closed_ = false;             // guarded by mu_
  std::atomic<bool> closed_flag_{false};
  std::atomic<size_t> queued_bytes_{0};
  std::atomic<bool> has_new_{false};
};

// One Generate stream of an shm client: on_chunk/on_done only queue records in the outbox.
class ShmGenerateSink : public RpcHandlers::GenerateStream {
 public:
  // `peer` names the client in the log ("shm client pid 12 uid 1000").
  ShmGenerateSink(std::shared_ptr<ShmOutbox> outbox, uint64_t request_id, std::string peer)
      : outbox_(std::move(outbox)), request_id_(request_id), peer_(std::move(peer)) {}

  void on_chunk(v1::GenerateChunk chunk) override;
  void on_done(RpcStatus status, v1::GenerateChunk last) override;
  // True once the connection cancelled the stream (kCancel record, or the client went), its outbox closed, or the
  // client stopped reading.
  bool cancelled() const override;
  void cancel() { cancel_.store(true, std::memory_order_release); }

 private:
  std::shared_ptr<ShmOutbox> outbox_;
  uint64_t request_id_;
  std::string peer_;
  std::atomic<bool> cancel_{false};
  std::atomic<bool> overflowed_{false};
};

}  // namespace kestrel::daemon
