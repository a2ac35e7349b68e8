// One shm client of kestreld: handshake, the request/response loop, and cleanup (shm_connection.h).
#include "daemon/shm/shm_connection.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>

#include "kestrel/shm/control_socket.h"

namespace kestrel::daemon {

using shm::Op;

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// ---- ShmConnection ---------------------------------------------------------------------------------------------

ShmConnection::ShmConnection(int socket_fd, ShmPeer peer, uint64_t owner, Service& service, RpcHandlers& handlers,
                             ShmAdmission& admission, LogThrottle& refusals, ShmConnectionOptions options)
    : socket_fd_(socket_fd),
      peer_(peer),
      owner_(owner),
      service_(service),
      handlers_(handlers),
      admission_(admission),
      refusals_(refusals),
      options_(options),
      name_("shm client pid " + std::to_string(peer.pid) + " uid " + std::to_string(peer.uid)) {}

ShmConnection::~ShmConnection() {
  if (socket_fd_ >= 0) close(socket_fd_);
}

void ShmConnection::request_stop() {
  stop_.store(true, std::memory_order_release);
  // Wake the connection thread if it sleeps on its doorbell (the handshake polls stop_ every 100 ms).
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (wake_target_) wake_target_->wake();
}

void ShmConnection::run() {
  Status hs = handshake();
  if (!hs) {
    admission_.abandon_handshake(peer_.uid);
    refusals_.warn(name_ + ": shm handshake failed: " + hs.error().message);
    cleanup(hs.error(), /*served=*/false);
  } else if (Status slot = admission_.promote(peer_.uid); !slot) {
    refusals_.warn(name_ + " refused after its handshake: " + slot.error().message);
    cleanup(slot.error(), /*served=*/false);
  } else {
    spdlog::info("{}: connected (shm segment of {} bytes, owner tag {})", name_, shm::kSegmentSize, hex(owner_));
    cleanup(serve(), /*served=*/true);
    admission_.release_client(peer_.uid);
  }
  finished_.store(true, std::memory_order_release);
}

Status ShmConnection::handshake() {
  KESTREL_TRY_ASSIGN(segment_, ShmSegment::create(owner_));
  shm::ControlMessage hello = shm::make_control(shm::kControlHello);
  hello.segment_size = shm::kSegmentSize;
  hello.owner_tag = owner_;
  KESTREL_TRY(shm::send_control(socket_fd_, hello, segment_->fd()));
  segment_->close_fd();  // the client holds its own copy now; the daemon keeps only the mapping
  const auto deadline = Clock::now() + options_.handshake_timeout;
  for (;;) {
    if (stop_.load()) return make_error(ErrorCode::kUnavailable, "the daemon is shutting down");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return make_error(ErrorCode::kDeadlineExceeded, "the client did not confirm the mapping within " +
                                                          std::to_string(options_.handshake_timeout.count()) + " ms");
    }
    auto got = shm::recv_control(socket_fd_, nullptr, std::min(left, std::chrono::milliseconds(100)));
    if (!got && got.error().code == ErrorCode::kDeadlineExceeded) continue;
    if (!got) return std::move(got).error();
    if (got->type != shm::kControlMapped) {
      return make_error(ErrorCode::kDataLoss,
                        "expected the 'mapped' message, got control message type " + std::to_string(got->type));
    }
    break;
  }
  const shm::SegmentView view = segment_->view();
  requests_ = shm::RingConsumer(view.request_ring(), view.request_data(), &view.response_ring()->bell);
  responses_ = shm::RingProducer(view.response_ring(), view.response_data());
  outbox_ = std::make_shared<ShmOutbox>(segment_, options_.max_queued_response_bytes);
  std::lock_guard<std::mutex> lock(wake_mu_);
  wake_target_ = outbox_;
  return ok_status();
}

Error ShmConnection::serve() {
  shm::Doorbell& bell = segment_->view().request_ring()->bell;
  shm::SegmentHeader* header = segment_->view().header();
  auto last_check = Clock::now();
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) return finish_on_stop();
    bool progress = false;
    auto wrote = flush();
    if (!wrote) return std::move(wrote).error();
    progress |= *wrote;
    if (outbox_->queued_bytes() <= options_.max_queued_response_bytes) {
      shm::Record record;
      for (int i = 0; i < 64; ++i) {
        auto got = requests_.pop(&record);
        if (!got) return std::move(got).error();
        if (!*got) break;
        handle(record);
        progress = true;
      }
    }
    const auto now = Clock::now();
    if (progress && now - last_check < options_.idle_check) continue;
    last_check = now;
    if (control_socket_closed()) return make_error(ErrorCode::kUnavailable, "the client closed its control socket");
    if (shm::shm_load(header->client_state) == shm::kStateClosed) {
      return make_error(ErrorCode::kUnavailable, "the client disconnected");
    }
    if (progress) continue;
    const bool can_read = outbox_->queued_bytes() <= options_.max_queued_response_bytes;
    shm::wait_on_bell(
        bell,
        [&] {
          return stop_.load(std::memory_order_acquire) || (can_read && requests_.readable()) || outbox_->has_new() ||
                 (!pending_.empty() && responses_.has_room(static_cast<uint32_t>(pending_.front().payload.size())));
        },
        options_.idle_check, 200);
  }
}

// request_stop() comes after the service has drained, so the answer to every request this connection took (a final
// chunk, a summary, an error) is queued already: write it out while the client keeps reading, for up to
// stop_flush_timeout, then end the connection. Without this a stream finished by the drain could lose its last
// records to the close.
Error ShmConnection::finish_on_stop() {
  shm::SegmentHeader* header = segment_->view().header();
  const auto deadline = Clock::now() + options_.stop_flush_timeout;
  while (Clock::now() < deadline) {
    auto wrote = flush();
    if (!wrote) return std::move(wrote).error();
    if (pending_.empty() && !outbox_->has_new()) break;
    if (shm::shm_load(header->client_state) == shm::kStateClosed || control_socket_closed()) break;
    if (!*wrote) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return make_error(ErrorCode::kUnavailable, "kestreld is shutting down");
}

Expected<bool> ShmConnection::flush() {
  if (outbox_->has_new()) outbox_->take_all(&pending_);
  bool wrote = false;
  while (!pending_.empty()) {
    ShmOutRecord& rec = pending_.front();
    const auto* bytes = reinterpret_cast<const uint8_t*>(rec.payload.data());
    KESTREL_TRY_ASSIGN(const bool pushed, responses_.push(rec.header, {bytes, rec.payload.size()}));
    if (!pushed) break;
    if ((rec.header.flags & shm::kFlagFinal) != 0) generations_.erase(rec.header.request_id);
    outbox_->record_written(rec.payload.size() + sizeof(shm::RecordHeader));
    pending_.pop_front();
    wrote = true;
  }
  return wrote;
}

bool ShmConnection::control_socket_closed() {
  pollfd p{socket_fd_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  // Nothing is expected on the socket after the handshake: EOF, or a protocol violation that ends the connection.
  char buf[sizeof(shm::ControlMessage)];
  const ssize_t n = recv(socket_fd_, buf, sizeof(buf), MSG_DONTWAIT);
  if (n > 0) spdlog::warn("{}: unexpected message on the shm control socket; closing the connection", name_);
  return n >= 0;
}

void ShmConnection::reply_error(uint64_t request_id, int code, std::string message) {
  outbox_->push(shm_error_record(request_id, code, std::move(message)), false);
}

void ShmConnection::reply(uint64_t request_id, Op op, const google::protobuf::MessageLite& message) {
  outbox_->push(shm_response_record(request_id, op, message, true), false);
}

namespace {

template <class Request>
bool parse_payload(const shm::Record& record, Request* request) {
  return request->ParseFromArray(record.payload.data(), static_cast<int>(record.payload.size()));
}

}  // namespace

void ShmConnection::handle(const shm::Record& record) {
  const shm::RecordHeader& h = record.header;
  const uint64_t id = h.request_id;
  if (h.kind == shm::kKindCancel) {
    if (auto it = generations_.find(id); it != generations_.end()) it->second->cancel();
    return;
  }
  if (!shm::is_request_kind(h.kind)) {
    spdlog::warn("{}: record of unknown kind {} (request {}) answered with INVALID_ARGUMENT", name_, hex(h.kind), id);
    reply_error(id, rpc_code::kInvalidArgument, "unknown shm record kind " + hex(h.kind));
    return;
  }
  if (id == 0 || h.flags != 0 || h.status != 0) {
    reply_error(id, rpc_code::kInvalidArgument,
                "malformed shm request header (request id must be non-zero, flags and status 0)");
    return;
  }
  const Op op = static_cast<Op>(h.kind);
  Deadline deadline;
  if (h.timeout_ms != 0) deadline = Clock::now() + std::chrono::milliseconds(h.timeout_ms);

  // Parses the payload as Request, runs call(request, &response) and answers.
  const auto unary = [&]<class Request, class Response>(Request request, Response response, auto call) {
    if (!parse_payload(record, &request)) {
      reply_error(id, rpc_code::kInvalidArgument,
                  "request " + std::to_string(id) + ": the payload is not a valid " + request.GetTypeName() +
                      " (malformed protobuf bytes, or a string field that is not UTF-8)");
      return;
    }
    const RpcStatus status = call(request, &response);
    if (!status.ok()) {
      reply_error(id, status.code, status.message);
    } else {
      reply(id, op, response);
    }
  };
  switch (op) {
    case Op::kGetModelInfo:
      unary(v1::GetModelInfoRequest{}, v1::ModelInfo{},
            [&](const auto& r, auto* out) { return handlers_.get_model_info(r, out); });
      return;
    case Op::kGetServerStatus:
      unary(v1::GetServerStatusRequest{}, v1::ServerStatus{},
            [&](const auto& r, auto* out) { return handlers_.get_server_status(r, out); });
      return;
    case Op::kTokenize:
      unary(v1::TokenizeRequest{}, v1::TokenizeResponse{},
            [&](const auto& r, auto* out) { return handlers_.tokenize(r, out, shm::kMaxPayloadSize); });
      return;
    case Op::kDetokenize:
      unary(v1::DetokenizeRequest{}, v1::DetokenizeResponse{},
            [&](const auto& r, auto* out) { return handlers_.detokenize(r, out, shm::kMaxPayloadSize); });
      return;
    case Op::kCreateSession:
      unary(v1::CreateSessionRequest{}, v1::SessionInfo{},
            [&](const auto& r, auto* out) { return handlers_.create_session(r, owner_, out); });
      return;
    case Op::kCloneSession:
      unary(v1::CloneSessionRequest{}, v1::SessionInfo{},
            [&](const auto& r, auto* out) { return handlers_.clone_session(r, owner_, out); });
      return;
    case Op::kResetSession:
      unary(v1::ResetSessionRequest{}, v1::SessionInfo{},
            [&](const auto& r, auto* out) { return handlers_.reset_session(r, out); });
      return;
    case Op::kCloseSession:
      unary(v1::CloseSessionRequest{}, v1::CloseSessionResponse{},
            [&](const auto& r, auto* out) { return handlers_.close_session(r, out); });
      return;
    case Op::kAbort:
      unary(v1::AbortRequest{}, v1::AbortResponse{}, [&](const auto& r, auto* out) { return handlers_.abort(r, out); });
      return;
    case Op::kStep: {
      v1::StepRequest request;
      if (!parse_payload(record, &request)) {
        reply_error(id, rpc_code::kInvalidArgument,
                    "request " + std::to_string(id) +
                        ": the payload is not a valid kestrel.v1.StepRequest (malformed protobuf bytes, or a string "
                        "field that is not UTF-8)");
        return;
      }
      handlers_.step(
          request, deadline,
          [outbox = outbox_, id](RpcStatus status, const v1::StepResponse& response) {
            if (status.ok()) {
              outbox->push(shm_response_record(id, Op::kStep, response, true), false);
            } else {
              outbox->push(shm_error_record(id, status.code, std::move(status.message)), false);
            }
          },
          Transport::kShm);
      return;
    }
    case Op::kGenerate: {
      v1::GenerateRequest request;
      if (!parse_payload(record, &request)) {
        reply_error(id, rpc_code::kInvalidArgument,
                    "request " + std::to_string(id) +
                        ": the payload is not a valid kestrel.v1.GenerateRequest (malformed protobuf bytes, or a "
                        "string field that is not UTF-8)");
        return;
      }
      if (generations_.contains(id)) {
        reply_error(id, rpc_code::kInvalidArgument,
                    "request id " + std::to_string(id) + " is already in use by a generation in flight");
        return;
      }
      auto sink = std::make_shared<ShmGenerateSink>(outbox_, id, name_);
      generations_.emplace(id, sink);
      handlers_.generate(request, deadline, owner_, sink, Transport::kShm);
      return;
    }
  }
}

void ShmConnection::cleanup(const Error& reason, bool served) {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_target_.reset();
  }
  // The outbox closes before the streams are cancelled: a chunk the engine delivers in between finds it closed and
  // is dropped quietly (ShmGenerateSink: the client went, it did not stop reading).
  if (outbox_) outbox_->close();
  for (auto& [id, sink] : generations_) sink->cancel();
  generations_.clear();
  pending_.clear();
  const uint32_t closed = service_.close_owned_by(owner_);
  if (segment_) {
    shm::shm_store(segment_->view().header()->daemon_state, shm::kStateClosed);
    shm::ring_bell(segment_->view().response_ring()->bell);
  }
  // Best effort: a live client learns why it was dropped (it reads this when its ring goes quiet).
  const RpcStatus status = to_rpc_status(reason);
  (void)shm::send_control(socket_fd_, shm::make_control(shm::kControlRefused, reason.message, status.code));
  if (served && reason.code == ErrorCode::kUnavailable) {
    spdlog::info("{}: disconnected ({}); closed {} session(s)", name_, reason.message, closed);
  } else if (served) {
    spdlog::warn("{}: connection dropped: {}; closed {} session(s)", name_, reason.message, closed);
  }
  close(socket_fd_);
  socket_fd_ = -1;
  // The mapping goes when the last engine callback holding the outbox is done.
  outbox_.reset();
  segment_.reset();
}

}  // namespace kestrel::daemon
