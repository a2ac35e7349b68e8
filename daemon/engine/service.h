// Service: the transport-independent API of kestreld, the one thing both servers (gRPC and shared memory) call.
// It owns the sessions table, the admission limits and the engine loop (scheduler.h) that advances every session's
// pending work together, one batched forward per tick (design.md §3 "Scheduling").
//
// Threading: every public method may be called from any thread. Quick calls (model_info, tokenize, sessions) return
// directly. step() and generate() queue work and return at once; their callbacks run later on the engine thread and
// MUST NOT block (push into a queue, StartWrite, write a ring slot; never wait on a client). A callback is called
// exactly once for step(); a GenerateSink gets any number of on_chunk() calls and then exactly one on_done().
// A request refused at admission (every check runs before anything is queued: bad input, unknown or busy session,
// a full limit, draining) gets that callback / on_done SYNCHRONOUSLY on the calling thread, before step() or
// generate() returns; everything later arrives on the engine thread. No Service lock is held during a callback, so
// a callback may call the Service again (e.g. the next step()), except drain() (it would wait for its own thread).
// Ownership: the Service borrows the Engine and Model given to create() for its lifetime; sinks are shared_ptr so
// that a transport may drop its side while the engine still holds the sink.
//
// Errors (kestrel::ErrorCode, mapped to gRPC codes at the edge: docs/api.md): kInvalidArgument (bad token id,
// empty tokens, bad sampling value), kNotFound (unknown session), kOutOfRange (context would overflow),
// kResourceExhausted (sessions / queued steps full), kFailedPrecondition (session busy), kCancelled (abort or
// client gone), kDeadlineExceeded, kUnavailable (draining).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/sampler/logprobs.h"
#include "core/sampler/sampling_params.h"
#include "daemon/engine/service_metrics.h"

namespace kestrel {
class Model;
}  // namespace kestrel

namespace kestrel::daemon {

using SessionId = uint64_t;  // never 0
using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;  // nullopt: none

// Per-request sampling overrides: set fields replace the session's parameters for that request only.
struct SamplingOverrides {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int32_t> top_k, penalty_last_n;
  std::optional<uint64_t> seed;  // restarts the session's RNG stream from this seed; it continues from there
  // The session's params with the set fields applied (not validated here).
  SamplingParams apply_to(SamplingParams base) const;
};

struct ModelInfo {
  std::string architecture, name, engine, model_path;
  int32_t n_vocab = 0, n_ctx_train = 0, max_session_ctx = 0, bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;
  int32_t n_layer = 0, n_embd = 0, n_expert = 0, n_expert_used = 0;
  std::string device;                     // the engine's PlacementPlan::device
  std::vector<PlacementEntry> placement;  // core/engine/engine.h
  std::string placement_summary;          // PlacementPlan::summary
  uint64_t file_bytes = 0;
  std::string chat_template;  // tokenizer.chat_template; empty: none
};

struct ServiceLimits {
  uint32_t max_sessions = 256;
  uint32_t max_queued_steps = 1024;  // step + generate requests waiting or running
  int32_t default_n_ctx = 4096;
  int32_t max_session_ctx = 32768;  // clamped to the model's training context
  int32_t max_batch_tokens = 2048;  // tokens in one tick (prefill is split into chunks across ticks)
  std::chrono::seconds default_idle_ttl{600};
  std::chrono::seconds max_idle_ttl{86400};
  SamplingParams default_sampling{};  // server-wide defaults; seed 0 here means "random per session"
  // A session created without a seed draws a random one when this is set and default_sampling.seed is 0;
  // otherwise it uses default_sampling.seed.
  bool random_seed_by_default = true;
};

struct ServiceStats {
  bool serving = false;
  uint32_t sessions = 0, queued_steps = 0;
  // Engine state slots held: one per open session, plus closed sessions whose request is still ending. At most
  // limits.max_sessions.
  uint32_t slots_held = 0;
  uint64_t ticks = 0, tokens_processed = 0, tokens_generated = 0;
  EngineCachePool cache;  // the engine's shared KV pool (all zero when its slots each own their cache)
};

struct SessionOptions {
  int32_t n_ctx = 0;  // 0 = limits.default_n_ctx
  SamplingOverrides sampling;
  std::chrono::seconds idle_ttl{0};  // 0 = limits.default_idle_ttl
  // Opaque owner tag (e.g. one shm connection); close_owned_by() closes every session with that tag. 0 = none.
  uint64_t owner = 0;
};

struct SessionInfo {
  SessionId id = 0;
  int32_t n_ctx = 0;
  int64_t n_past = 0;
};

struct StepRequest {
  SessionId session = 0;
  std::vector<int32_t> tokens;  // >= 1
  SamplingOverrides sampling;
  int32_t top_logprobs = 0;  // 0..20
  Deadline deadline;
  Transport transport = Transport::kGrpc;  // the transport that carries it (its metrics label)
};

struct StepResult {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
  int64_t n_past = 0;
};

// kAborted: Abort, or the session was closed while the request ran. kShutdown: the daemon's drain deadline passed
// (or it stopped without one) before the generation finished; GenerateSummary::message says which.
enum class FinishReason { kStopToken, kStopString, kMaxTokens, kContextFull, kAborted, kShutdown };
const char* finish_reason_name(FinishReason reason);

struct GenerateRequest {
  SessionId session = 0;        // 0: temporary session created with n_ctx and closed at the end
  std::vector<int32_t> prompt;  // >= 1 token (text prompts are tokenized by the transport via tokenize())
  int32_t max_tokens = 0;       // > 0
  SamplingOverrides sampling;
  std::vector<int32_t> stop_tokens;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  int32_t top_logprobs = 0;
  int32_t n_ctx = 0;  // temporary session only
  Deadline deadline;
  uint64_t owner = 0;                      // owner tag of a temporary session
  Transport transport = Transport::kGrpc;  // the transport that carries it (its metrics label)
};

struct GenerateChunk {
  std::vector<int32_t> tokens;
  std::string text;  // valid UTF-8: bytes of an unfinished character are held back; stop-string prefixes too
  std::vector<StepResult> logprobs;  // one per token when top_logprobs > 0 (token, logprob, top)
  SessionId session = 0;
  int64_t n_past = 0;
};

struct GenerateSummary {
  FinishReason reason = FinishReason::kMaxTokens;
  std::string message;  // why it ended early, for kShutdown ("kestreld is shutting down: ..."); empty otherwise
  uint32_t prompt_tokens = 0, completion_tokens = 0;
  SessionId session = 0;
  int64_t n_past = 0;
};

// Receives one generation's output on the engine thread. Must not block.
class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  virtual void on_chunk(GenerateChunk chunk) = 0;
  // Exactly once, last. An error (kCancelled, kDeadlineExceeded, kOutOfRange, ...) ends the stream with that status;
  // a finish reason (including kAborted) ends it normally.
  virtual void on_done(Expected<GenerateSummary> result) = 0;
  // Polled by the engine between ticks: true once the transport's peer is gone (stream cancelled, client dead);
  // the generation then ends with kCancelled without further on_chunk calls.
  virtual bool cancelled() const { return false; }
};

class Service {
 public:
  virtual ~Service() = default;

  virtual ModelInfo model_info() const = 0;
  virtual ServiceStats stats() const = 0;
  virtual ServiceLimits limits() const = 0;
  // The request counters, histograms and gauges (service_metrics.h); valid for the Service's lifetime.
  virtual const ServiceMetrics& metrics() const = 0;

  virtual Expected<std::vector<int32_t>> tokenize(const std::string& text, bool parse_special) const = 0;
  // Exact bytes; kInvalidArgument naming the first id outside the vocabulary; kResourceExhausted, before any text
  // is built, when the bytes would be more than max_bytes (the sum of the tokens' piece lengths is checked first).
  virtual Expected<std::string> detokenize(const std::vector<int32_t>& tokens, size_t max_bytes) const = 0;

  virtual Expected<SessionInfo> create_session(const SessionOptions& options) = 0;
  virtual Expected<SessionInfo> clone_session(SessionId id, uint64_t owner) = 0;
  virtual Expected<SessionInfo> reset_session(SessionId id) = 0;
  virtual Status close_session(SessionId id) = 0;
  // Closes every session whose owner tag is `owner` (a dead shm client), aborting their requests. Returns how many.
  virtual uint32_t close_owned_by(uint64_t owner) = 0;

  virtual void step(StepRequest request, std::function<void(Expected<StepResult>)> done) = 0;
  virtual void generate(GenerateRequest request, std::shared_ptr<GenerateSink> sink) = 0;
  // Cancels the in-flight request of a session; false when none. kNotFound for an unknown session.
  virtual Expected<bool> abort(SessionId id) = 0;

  // Stops admitting work (new requests get kUnavailable), lets in-flight requests finish until `deadline`, then
  // ends what is left: a Step with kUnavailable, a Generate with FinishReason::kShutdown, both with a message that
  // names the drain time. Blocks the caller (not the engine thread) until the engine loop has stopped.
  virtual void drain(Clock::time_point deadline) = 0;
};

// Builds the Service over `engine` (which serves `model`) and starts its engine loop thread. Borrows both for the
// Service's lifetime (destroy the Service first). The limits are checked (kInvalidArgument naming the bad one);
// max_session_ctx is clamped to the model's training context and default_n_ctx to max_session_ctx (limits() shows
// the values in force). Implemented in service_impl.cpp.
Expected<std::unique_ptr<Service>> make_service(const Model& model, Engine& engine, const ServiceLimits& limits);

}  // namespace kestrel::daemon
