// The shared-memory transport of libkestrel-client (docs/shm.md): connects to kestreld's shm control socket,
// receives its private segment's fd, maps and checks it, then sends every Client call as a request record and
// reads the answers from the response ring. Concurrent calls are multiplexed by request id: callers serialise only
// on writing into the request ring; one reader thread copies each response out, validates it, and hands it to the
// waiting call. When kestreld goes (EOF on the control socket, its liveness word, a corrupt ring) every pending
// and later call fails with UNAVAILABLE instead of hanging.
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <system_error>
#include <thread>

#include "client/lib/transports.h"
#include "kestrel/shm/control_socket.h"
#include "kestrel/shm/spsc_ring.h"
#include "proto/kestrel/grpc_codes.h"

namespace kestrel::client {
namespace {

using shm::Op;
using namespace std::chrono_literals;

Error call_error(int code, const std::string& message) {
  return make_error(error_code_from_grpc(code), std::string(grpc_code::name(code)) + ": " + message);
}

constexpr int kUnavailable = 14;
constexpr int kDeadlineExceeded = 4;
constexpr int kInternal = 13;
constexpr int kResourceExhausted = 8;

// One call waiting for its answer records.
struct PendingCall {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<shm::Record> records;  // guarded by mu
  bool failed = false;              // guarded by mu
  Error failure;                    // guarded by mu
};

class ShmClient final : public Client {
 public:
  ShmClient(int socket_fd, uint8_t* base, ClientOptions options)
      : socket_fd_(socket_fd), base_(base), options_(options) {
    const shm::SegmentView view{base_};
    requests_ = shm::RingProducer(view.request_ring(), view.request_data());
    responses_ = shm::RingConsumer(view.response_ring(), view.response_data(), &view.request_ring()->bell);
    reader_ = std::thread([this] { reader_loop(); });
  }

  ~ShmClient() override {
    const shm::SegmentView view{base_};
    shm::shm_store(view.header()->client_state, shm::kStateClosed);
    shm::ring_bell(view.request_ring()->bell);
    stop_.store(true, std::memory_order_release);
    shm::ring_bell(view.response_ring()->bell);
    reader_.join();
    close(socket_fd_);
    munmap(base_, shm::kSegmentSize);
  }

  std::string transport() const override { return "shm"; }

  Expected<v1::ModelInfo> model_info() override {
    return unary<v1::ModelInfo>(Op::kGetModelInfo, v1::GetModelInfoRequest{});
  }
  Expected<v1::ServerStatus> server_status() override {
    return unary<v1::ServerStatus>(Op::kGetServerStatus, v1::GetServerStatusRequest{});
  }
  Expected<v1::TokenizeResponse> tokenize(const v1::TokenizeRequest& r) override {
    return unary<v1::TokenizeResponse>(Op::kTokenize, r);
  }
  Expected<v1::DetokenizeResponse> detokenize(const v1::DetokenizeRequest& r) override {
    return unary<v1::DetokenizeResponse>(Op::kDetokenize, r);
  }
  Expected<v1::SessionInfo> create_session(const v1::CreateSessionRequest& r) override {
    return unary<v1::SessionInfo>(Op::kCreateSession, r);
  }
  Expected<v1::SessionInfo> clone_session(const v1::CloneSessionRequest& r) override {
    return unary<v1::SessionInfo>(Op::kCloneSession, r);
  }
  Expected<v1::SessionInfo> reset_session(const v1::ResetSessionRequest& r) override {
    return unary<v1::SessionInfo>(Op::kResetSession, r);
  }
  Status close_session(const v1::CloseSessionRequest& r) override {
    KESTREL_TRY(unary<v1::CloseSessionResponse>(Op::kCloseSession, r));
    return ok_status();
  }
  Expected<v1::StepResponse> step(const v1::StepRequest& r) override { return unary<v1::StepResponse>(Op::kStep, r); }
  Expected<v1::AbortResponse> abort(const v1::AbortRequest& r) override {
    return unary<v1::AbortResponse>(Op::kAbort, r);
  }

  Expected<v1::GenerateChunk> generate(const v1::GenerateRequest& request,
                                       const std::function<bool(const v1::GenerateChunk&)>& on_chunk) override {
    const auto deadline = call_deadline();
    KESTREL_TRY_ASSIGN(const uint64_t id, send_request(Op::kGenerate, request, deadline));
    bool cancel_sent = false;
    for (;;) {
      auto record = next_record(id, deadline);
      if (!record) {
        forget(id);
        if (!cancel_sent) (void)send_cancel(id);
        return std::move(record).error();
      }
      auto chunk = decode<v1::GenerateChunk>(Op::kGenerate, *record);
      const bool final = (record->header.flags & shm::kFlagFinal) != 0;
      if (!chunk || final) {
        forget(id);
        if (!chunk && !final && !cancel_sent) (void)send_cancel(id);
        return chunk;
      }
      if (!cancel_sent && !on_chunk(*chunk)) {
        cancel_sent = true;
        KESTREL_TRY(send_cancel(id));
      }
    }
  }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;

  std::optional<TimePoint> call_deadline() const {
    if (options_.timeout.count() <= 0) return std::nullopt;
    return std::chrono::steady_clock::now() + options_.timeout;
  }

  template <class Response, class Request>
  Expected<Response> unary(Op op, const Request& request) {
    const auto deadline = call_deadline();
    KESTREL_TRY_ASSIGN(const uint64_t id, send_request(op, request, deadline));
    auto record = next_record(id, deadline);
    forget(id);
    if (!record) return std::move(record).error();
    return decode<Response>(op, *record);
  }

  // The answer's payload as Response, or the error it carries. Anything else is a daemon bug: INTERNAL.
  template <class Response>
  Expected<Response> decode(Op op, const shm::Record& record) {
    if (record.header.kind == shm::kKindError) {
      const std::string message(record.payload.begin(), record.payload.end());
      return call_error(record.header.status, message);
    }
    Response response;
    if (record.header.kind != shm::response_kind(op) ||
        !response.ParseFromArray(record.payload.data(), static_cast<int>(record.payload.size()))) {
      return call_error(kInternal, "kestreld sent a malformed shm response (kind " +
                                       std::to_string(record.header.kind) + ") to a " + std::to_string(int(op)) +
                                       " request");
    }
    return response;
  }

  Expected<uint64_t> send_request(Op op, const google::protobuf::MessageLite& request,
                                  std::optional<TimePoint> deadline) {
    std::string payload;
    request.SerializeToString(&payload);
    if (payload.size() > shm::kMaxPayloadSize) {
      return call_error(kResourceExhausted, "the request is " + std::to_string(payload.size()) +
                                                " bytes, over the shm record limit of " +
                                                std::to_string(shm::kMaxPayloadSize) + " bytes; use gRPC for it");
    }
    const uint64_t id = next_id_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(calls_mu_);
      if (broken_) return broken_error_;
      calls_.emplace(id, std::make_shared<PendingCall>());
    }
    shm::RecordHeader h{};
    h.kind = shm::request_kind(op);
    h.request_id = id;
    if (deadline) h.timeout_ms = static_cast<uint32_t>(std::max<int64_t>(1, options_.timeout.count()));
    Status sent = write_record(h, payload, deadline);
    if (!sent) {
      forget(id);
      return std::move(sent).error();
    }
    return id;
  }

  Status send_cancel(uint64_t id) {
    shm::RecordHeader h{};
    h.kind = shm::kKindCancel;
    h.request_id = id;
    return write_record(h, {}, std::chrono::steady_clock::now() + 5s);
  }

  Status write_record(const shm::RecordHeader& h, const std::string& payload, std::optional<TimePoint> deadline) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
    std::lock_guard<std::mutex> lock(write_mu_);
    shm::Doorbell& bell = shm::SegmentView{base_}.response_ring()->bell;  // the daemon rings it when it frees space
    for (;;) {
      if (broken()) return broken_status();
      auto pushed = requests_.push(h, {bytes, payload.size()});
      if (!pushed) return call_error(kUnavailable, "shm request ring: " + pushed.error().message);
      if (*pushed) return ok_status();
      if (deadline && std::chrono::steady_clock::now() > *deadline) {
        return call_error(kDeadlineExceeded, "kestreld did not take the request before the deadline (ring full)");
      }
      shm::wait_on_bell(
          bell, [&] { return broken() || requests_.has_room(static_cast<uint32_t>(payload.size())); }, 10ms, 200);
    }
  }

  // The next record answering `id`, waiting until `deadline` (plus a grace second for the daemon's own answer).
  Expected<shm::Record> next_record(uint64_t id, std::optional<TimePoint> deadline) {
    std::shared_ptr<PendingCall> call;
    {
      std::lock_guard<std::mutex> lock(calls_mu_);
      auto it = calls_.find(id);
      if (it == calls_.end()) return broken_status().error();
      call = it->second;
    }
    std::unique_lock<std::mutex> lock(call->mu);
    const auto ready = [&] { return !call->records.empty() || call->failed; };
    if (deadline) {
      if (!call->cv.wait_until(lock, *deadline + 1s, ready)) {
        return call_error(kDeadlineExceeded,
                          "no answer from kestreld within " + std::to_string(options_.timeout.count()) + " ms");
      }
    } else {
      call->cv.wait(lock, ready);
    }
    if (!call->records.empty()) {
      shm::Record r = std::move(call->records.front());
      call->records.pop_front();
      return r;
    }
    return call->failure;
  }

  void forget(uint64_t id) {
    std::lock_guard<std::mutex> lock(calls_mu_);
    calls_.erase(id);
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(calls_mu_);
    return broken_;
  }
  Status broken_status() {
    std::lock_guard<std::mutex> lock(calls_mu_);
    if (broken_) return broken_error_;
    return call_error(kInternal, "shm call state lost");
  }

  // Marks the connection dead and fails every pending call with `error`.
  void fail_all(const Error& error) {
    std::map<uint64_t, std::shared_ptr<PendingCall>> calls;
    {
      std::lock_guard<std::mutex> lock(calls_mu_);
      broken_ = true;
      broken_error_ = error;
      calls = calls_;
    }
    for (auto& [id, call] : calls) {
      std::lock_guard<std::mutex> lock(call->mu);
      call->failed = true;
      call->failure = error;
      call->cv.notify_all();
    }
    shm::ring_bell(shm::SegmentView{base_}.response_ring()->bell);  // a writer waiting for ring space
  }

  // Why the daemon ended the connection: its last control message, if it sent one.
  std::string daemon_reason() {
    auto msg = shm::recv_control(socket_fd_, nullptr, 10ms);
    if (msg && msg->type == shm::kControlRefused && msg->message[0] != '\0') {
      return std::string(": ") + msg->message;
    }
    return "";
  }

  void reader_loop() {
    const shm::SegmentView view{base_};
    shm::Doorbell& bell = view.response_ring()->bell;
    shm::Record record;
    while (!stop_.load(std::memory_order_acquire)) {
      auto got = responses_.pop(&record);
      if (!got) {
        fail_all(call_error(kUnavailable, "the shm connection to kestreld is broken: " + got.error().message));
        return;
      }
      if (*got) {
        deliver(std::move(record));
        continue;
      }
      if (shm::shm_load(view.header()->daemon_state) == shm::kStateClosed || control_socket_closed()) {
        // Answers written before the daemon left are still delivered.
        while (true) {
          auto more = responses_.pop(&record);
          if (!more || !*more) break;
          deliver(std::move(record));
        }
        fail_all(call_error(kUnavailable, "kestreld closed the shm connection" + daemon_reason()));
        return;
      }
      shm::wait_on_bell(
          bell, [&] { return stop_.load(std::memory_order_acquire) || responses_.readable(); }, 100ms, 2000);
    }
  }

  void deliver(shm::Record record) {
    std::shared_ptr<PendingCall> call;
    {
      std::lock_guard<std::mutex> lock(calls_mu_);
      auto it = calls_.find(record.header.request_id);
      if (it == calls_.end()) return;  // a call that already gave up (deadline, cancelled generation)
      call = it->second;
    }
    std::lock_guard<std::mutex> lock(call->mu);
    call->records.push_back(std::move(record));
    call->cv.notify_all();
  }

  bool control_socket_closed() {
    pollfd p{socket_fd_, POLLIN, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }

  int socket_fd_;
  uint8_t* base_;  // u8 [kSegmentSize], MAP_SHARED
  ClientOptions options_;
  shm::RingProducer requests_;   // guarded by write_mu_
  shm::RingConsumer responses_;  // reader thread only
  std::mutex write_mu_;
  std::mutex calls_mu_;
  std::map<uint64_t, std::shared_ptr<PendingCall>> calls_;  // guarded by calls_mu_
  bool broken_ = false;                                     // guarded by calls_mu_
  Error broken_error_;                                      // guarded by calls_mu_
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> stop_{false};
  std::thread reader_;
};

// One handshake (docs/shm.md "Handshake"). *busy is set when kestreld refused with UNAVAILABLE: its handshake
// places were taken for the moment.
Expected<std::unique_ptr<Client>> connect_once(const std::string& control_socket, const ClientOptions& options,
                                               std::chrono::milliseconds timeout, bool* busy) {
  KESTREL_TRY_ASSIGN(const int fd, shm::connect_control_socket(control_socket));
  int segment_fd = -1;
  auto hello = shm::recv_control(fd, &segment_fd, timeout);
  const auto fail = [&](Error e) -> Expected<std::unique_ptr<Client>> {
    if (segment_fd >= 0) close(segment_fd);
    close(fd);
    return e;
  };
  if (!hello) {
    return fail(
        call_error(kUnavailable, "no shm hello from kestreld at '" + control_socket + "': " + hello.error().message));
  }
  if (hello->type == shm::kControlRefused) {
    *busy = hello->status == kUnavailable;
    return fail(call_error(hello->status, hello->message));
  }
  if (hello->type != shm::kControlHello || segment_fd < 0 || hello->segment_size != shm::kSegmentSize) {
    return fail(call_error(
        kUnavailable, "kestreld at '" + control_socket + "' sent an unexpected shm handshake (version mismatch?)"));
  }
  struct stat st {};
  if (fstat(segment_fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != shm::kSegmentSize) {
    return fail(call_error(kUnavailable, "the shm segment from kestreld has the wrong size"));
  }
  void* p = mmap(nullptr, shm::kSegmentSize, PROT_READ | PROT_WRITE, MAP_SHARED, segment_fd, 0);
  if (p == MAP_FAILED)
    return fail(call_error(kUnavailable,
                           "cannot map the shm segment: " + std::error_code(errno, std::system_category()).message()));
  close(segment_fd);
  segment_fd = -1;
  const shm::SegmentView view{static_cast<uint8_t*>(p)};
  Status valid = shm::validate_segment_header(view, shm::kSegmentSize);
  if (!valid) {
    munmap(p, shm::kSegmentSize);
    return fail(call_error(kUnavailable, valid.error().message));
  }
  shm::shm_store(view.header()->client_state, shm::kStateReady);
  Status mapped = shm::send_control(fd, shm::make_control(shm::kControlMapped));
  if (!mapped) {
    munmap(p, shm::kSegmentSize);
    return fail(call_error(kUnavailable, mapped.error().message));
  }
  return std::unique_ptr<Client>(new ShmClient(fd, view.base, options));
}

}  // namespace

// A refusal with UNAVAILABLE means kestreld's handshake places are taken for the moment (many connections at once,
// docs/shm.md "Places"): the handshake is tried again after a short pause that grows (2 ms up to 100 ms, with
// jitter), until connect_timeout. Any other refusal or failure is returned at once.
Expected<std::unique_ptr<Client>> make_shm_client(const std::string& control_socket, const ClientOptions& options) {
  using std::chrono::milliseconds;
  const auto deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  std::minstd_rand jitter(static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  milliseconds pause{2};
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    bool busy = false;
    auto client = connect_once(control_socket, options, std::max(left, milliseconds(1)), &busy);
    if (client || !busy || left <= pause) return client;
    std::this_thread::sleep_for(pause + milliseconds(jitter() % (pause.count() + 1)));
    pause = std::min(pause * 2, milliseconds(100));
  }
}

}  // namespace kestrel::client
