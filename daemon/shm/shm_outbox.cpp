// ShmOutbox and ShmGenerateSink (shm_outbox.h).
#include "daemon/shm/shm_outbox.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace kestrel::daemon {

ShmOutRecord shm_error_record(uint64_t request_id, int code, std::string message) {
  ShmOutRecord rec;
  rec.header.kind = shm::kKindError;
  rec.header.flags = shm::kFlagFinal;
  rec.header.request_id = request_id;
  rec.header.status = code == rpc_code::kOk ? rpc_code::kInternal : code;
  if (message.size() > 4096) message.resize(4096);
  rec.payload = std::move(message);
  return rec;
}

ShmOutRecord shm_response_record(uint64_t request_id, shm::Op op, const google::protobuf::MessageLite& message,
                                 bool final) {
  ShmOutRecord rec;
  const size_t size = message.ByteSizeLong();
  if (size > shm::kMaxPayloadSize) {
    return shm_error_record(request_id, rpc_code::kResourceExhausted,
                            "the response is " + std::to_string(size) + " bytes, over the shm record limit of " +
                                std::to_string(shm::kMaxPayloadSize) + " bytes; make this call over gRPC");
  }
  rec.header.kind = shm::response_kind(op);
  rec.header.flags = final ? shm::kFlagFinal : 0;
  rec.header.request_id = request_id;
  message.SerializeToString(&rec.payload);
  return rec;
}

// ---- ShmOutbox -------------------------------------------------------------------------------------------------

ShmPush ShmOutbox::push(ShmOutRecord record, bool bounded) {
  const size_t bytes = record.payload.size() + sizeof(shm::RecordHeader);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return ShmPush::kClosed;
    if (bounded && queued_bytes_.load(std::memory_order_relaxed) > max_bytes_) return ShmPush::kFull;
    queue_.push_back(std::move(record));
    queued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    has_new_.store(true, std::memory_order_release);
  }
  wake();
  return ShmPush::kQueued;
}

void ShmOutbox::take_all(std::deque<ShmOutRecord>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  has_new_.store(false, std::memory_order_relaxed);
  for (auto& r : queue_) out->push_back(std::move(r));
  queue_.clear();
}

void ShmOutbox::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  closed_flag_.store(true, std::memory_order_release);
  queue_.clear();
}

// The connection thread sleeps on the request ring's doorbell (it is that ring's consumer).
void ShmOutbox::wake() const { shm::ring_bell(segment_->view().request_ring()->bell); }

// ---- ShmGenerateSink -------------------------------------------------------------------------------------------

void ShmGenerateSink::on_chunk(v1::GenerateChunk chunk) {
  if (overflowed_.load(std::memory_order_relaxed)) return;
  // A closed outbox means the connection ended (the client went or the daemon stops): the chunk has nowhere to go
  // and cancelled() already says so; only a full one means the client stopped reading.
  if (outbox_->push(shm_response_record(request_id_, shm::Op::kGenerate, chunk, false), /*bounded=*/true) ==
      ShmPush::kFull) {
    if (!overflowed_.exchange(true)) {
      spdlog::warn("{}: not reading its responses ({} bytes queued, limit {}); aborting its generation (request {})",
                   peer_, outbox_->queued_bytes(), outbox_->max_bytes(), request_id_);
    }
  }
}

void ShmGenerateSink::on_done(RpcStatus status, v1::GenerateChunk last) {
  if (overflowed_.load()) {
    status = RpcStatus{rpc_code::kResourceExhausted,
                       "generation aborted: the client did not read its responses (more than " +
                           std::to_string(outbox_->max_bytes()) + " bytes were queued in the daemon)"};
  }
  if (status.ok()) {
    outbox_->push(shm_response_record(request_id_, shm::Op::kGenerate, last, true), false);
  } else {
    outbox_->push(shm_error_record(request_id_, status.code, std::move(status.message)), false);
  }
}

bool ShmGenerateSink::cancelled() const {
  return cancel_.load(std::memory_order_acquire) || overflowed_.load(std::memory_order_acquire) || outbox_->closed();
}

}  // namespace kestrel::daemon
