// RpcHandlers: the one place that turns kestrel.v1 requests into Service calls, and Service results and errors into
// kestrel.v1 responses and gRPC status codes (docs/api.md). Both transports call it: the gRPC server
// (grpc_server.h) from its reactors, and the shared-memory server from its ring reader, which has no
// grpc::ServerContext; so nothing here depends on gRPC's server API, only on the generated messages.
//
// What it adds on top of the Service: validation of what the proto allows but the Service does not expect (negative
// ids, ids outside the vocabulary, top_logprobs outside 0..20, max_tokens <= 0, empty prompts, stop strings over the
// limits below, bad sampling values), with INVALID_ARGUMENT messages that name the offending value; tokenization of
// text prompts (Service::tokenize); U+FFFD replacement of invalid UTF-8 in text fields (protobuf strings must be
// valid UTF-8; DetokenizeResponse.raw keeps the exact bytes).
//
// Threading: every method may be called from any thread, concurrently. Quick calls return their answer. step() and
// generate() return at once: their callbacks run later on the engine thread and must not block (queue the response,
// StartWrite, write a ring slot). When a request is refused before it reaches the engine (validation, tokenizing a
// text prompt) the callback runs on the calling thread, before step() / generate() return.
// Ownership: RpcHandlers borrows the Service, which must outlive it and every callback still pending.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/base/expected.h"
#include "daemon/engine/service.h"
#include "kestrel/v1/kestrel.pb.h"
#include "proto/kestrel/grpc_codes.h"

namespace kestrel::daemon {

// gRPC status code numbers (proto/kestrel/grpc_codes.h: one table for the daemon, the shm transport and the client).
namespace rpc_code = ::kestrel::grpc_code;

// The outcome of one call at the edge: a gRPC status code number and the message the client sees.
struct RpcStatus {
  int code = rpc_code::kOk;
  std::string message;

  bool ok() const { return code == rpc_code::kOk; }
};

// kestrel::ErrorCode → gRPC code (the table at the top of kestrel.proto and in docs/api.md): kInvalidArgument →
// INVALID_ARGUMENT, kNotFound → NOT_FOUND, kOutOfRange → OUT_OF_RANGE, kResourceExhausted → RESOURCE_EXHAUSTED,
// kFailedPrecondition → FAILED_PRECONDITION, kCancelled → CANCELLED, kDeadlineExceeded → DEADLINE_EXCEEDED,
// kUnavailable → UNAVAILABLE, kUnsupported → UNIMPLEMENTED, kDataLoss → DATA_LOSS, kIo and kInternal → INTERNAL.
// The message is the Error's message unchanged.
RpcStatus to_rpc_status(const Error& error);

// "NOT_FOUND" for 5, ...; "UNKNOWN" for numbers outside 0..16.
inline const char* rpc_code_name(int code) { return grpc_code::name(code); }

// Text with every byte that does not start a well-formed UTF-8 sequence replaced by U+FFFD (one per byte).
std::string utf8_sanitize(std::string_view bytes);
// utf8_sanitize(bytes).size(), without building it.
size_t utf8_sanitized_size(std::string_view bytes);

// Limits on what a request may carry beyond the Service's own (docs/api.md "Limits"). The whole message is also
// bounded by the transport (gRPC: 4 MiB received).
struct RpcLimits {
  int32_t max_stop_strings = 16;        // GenerateRequest.stop_strings entries
  int32_t max_stop_string_bytes = 256;  // bytes per stop string (each must be non-empty)
  int32_t max_stop_tokens = 64;         // GenerateRequest.stop_tokens entries
  // One response message. Responses whose size depends on the request (Tokenize: tokens of the text; Detokenize:
  // text and raw bytes of the tokens) are sized before they are built; over this (or the transport's own limit,
  // whichever is smaller) the call answers RESOURCE_EXHAUSTED naming both sizes. Every other response is small by
  // construction (a Step's top_logprobs <= 20, a Generate chunk holds one tick's tokens).
  size_t max_response_bytes = size_t{16} << 20;
};

// Fields of ServerStatus that the Service does not know.
struct ServerIdentity {
  std::string version;  // kestreld's version string
  Clock::time_point started = Clock::now();
};

class RpcHandlers {
 public:
  // Reads the Service's model_info() and limits() once (they do not change while it runs).
  explicit RpcHandlers(Service& service, RpcLimits limits = {}, ServerIdentity identity = {});
  // Without a Service yet (kestreld while it loads its model): every call answers UNAVAILABLE ("loading") until
  // attach(), so the gRPC listener and its health service (NOT_SERVING) can exist from the first second.
  explicit RpcHandlers(RpcLimits limits = {}, ServerIdentity identity = {});
  // Connects the Service once it exists; at most once, from any thread (calls in flight see it or the loading
  // answer). The Service must outlive every later call.
  void attach(Service& service);
  bool attached() const { return attached_.load(std::memory_order_acquire) != nullptr; }

  const RpcLimits& limits() const { return limits_; }
  // The number the shm server reports as ServerStatus.shm_clients (it calls this when a client comes or goes).
  void set_shm_clients(uint32_t n) { shm_clients_.store(n, std::memory_order_relaxed); }

  RpcStatus get_model_info(const v1::GetModelInfoRequest& request, v1::ModelInfo* out) const;
  RpcStatus get_server_status(const v1::GetServerStatusRequest& request, v1::ServerStatus* out) const;
  // transport_max_bytes: the largest message the calling transport can carry (the shm record payload), when it is
  // below limits().max_response_bytes.
  RpcStatus tokenize(const v1::TokenizeRequest& request, v1::TokenizeResponse* out,
                     size_t transport_max_bytes = SIZE_MAX) const;
  RpcStatus detokenize(const v1::DetokenizeRequest& request, v1::DetokenizeResponse* out,
                       size_t transport_max_bytes = SIZE_MAX) const;
  // owner: the transport's tag for the caller (an shm connection id; 0 for gRPC), see SessionOptions::owner.
  RpcStatus create_session(const v1::CreateSessionRequest& request, uint64_t owner, v1::SessionInfo* out);
  RpcStatus clone_session(const v1::CloneSessionRequest& request, uint64_t owner, v1::SessionInfo* out);
  RpcStatus reset_session(const v1::ResetSessionRequest& request, v1::SessionInfo* out);
  RpcStatus close_session(const v1::CloseSessionRequest& request, v1::CloseSessionResponse* out);
  RpcStatus abort(const v1::AbortRequest& request, v1::AbortResponse* out);

  // Validates and queues one step. `done` is called exactly once: on the engine thread with the result, or on the
  // calling thread when the request is refused before it is queued. The response is meaningful only when ok().
  // `transport` labels the request in the Service's metrics.
  using StepDone = std::function<void(RpcStatus status, v1::StepResponse response)>;
  void step(const v1::StepRequest& request, Deadline deadline, StepDone done, Transport transport = Transport::kGrpc);

  // The transport's side of one Generate stream. on_chunk any number of times, then on_done exactly once; both on
  // the engine thread (or on_done alone on the calling thread when the request is refused before it is queued).
  // Neither may block.
  class GenerateStream {
   public:
    virtual ~GenerateStream() = default;
    virtual void on_chunk(v1::GenerateChunk chunk) = 0;
    // ok: `last` carries finish_reason, session_id, n_past, prompt_tokens and completion_tokens (and no tokens).
    // Not ok: the stream ends with that status; `last` is empty.
    virtual void on_done(RpcStatus status, v1::GenerateChunk last) = 0;
    // Polled by the engine between ticks: true once the peer is gone; the generation then ends with CANCELLED.
    // Called from the engine thread: make it an atomic load.
    virtual bool cancelled() const = 0;
  };

  // Validates, tokenizes a text prompt, and queues one generation. owner tags a temporary session (session_id 0);
  // `transport` labels the request in the Service's metrics.
  void generate(const v1::GenerateRequest& request, Deadline deadline, uint64_t owner,
                std::shared_ptr<GenerateStream> stream, Transport transport = Transport::kGrpc);

 private:
  // The Service and what is read from it once; published by attach() with release, read with acquire.
  struct Attached {
    Service* service;
    ModelInfo model;
    ServiceLimits limits;
  };
  const Attached* ready() const { return attached_.load(std::memory_order_acquire); }
  static Status check_tokens(const Attached& a, const google::protobuf::RepeatedField<int32_t>& tokens,
                             const char* field);
  // RESOURCE_EXHAUSTED for a response of `call` over the limit; `what` says how large it would be.
  RpcStatus response_too_large(const char* call, const std::string& what, size_t transport_max_bytes) const;

  RpcLimits limits_;
  ServerIdentity identity_;
  std::unique_ptr<Attached> attached_owner_;  // written once, by attach()
  std::atomic<const Attached*> attached_{nullptr};
  std::atomic<uint32_t> shm_clients_{0};
};

}  // namespace kestrel::daemon
