// CompletionCall: one /v1/completions or /v1/chat/completions request in flight — the Service's GenerateSink on one
// side, the connection's Exchange on the other.
//
// The engine thread calls on_chunk / on_done, which only post the work to the connection's strand (they never block
// and never encode); on the strand each chunk becomes an SSE event (streaming) or is kept for the whole response.
// Event stream headers go out when begin() finds the request admitted, so a request refused at admission (a full
// limit, a prompt past the context, draining) is a plain HTTP error; an error after that is an error event.
//
// The generation is cancelled (GenerateSink::cancelled) when the client is gone, or when it stops reading while
// more than kMaxPendingBytes wait to be written; the connection is then closed. Without streaming, the whole answer
// is kept until the end: its size (openai_encode.h body_size_bound) is added up as chunks arrive, and the chunk that
// would take it past Setup::max_response_bytes is not kept: the generation is cancelled and the answer is a 400
// (code response_too_large) that says to stream or ask for fewer tokens or alternatives.
//
// Threading: the GenerateSink methods on the engine thread (or on the strand, for a refusal at admission);
// begin() and everything it posts on the strand. `release` runs once, on the strand, when the call has answered.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/service.h"
#include "daemon/http/http_exchange.h"
#include "daemon/http/openai_encode.h"

namespace kestrel::daemon::http {

class CompletionCall final : public GenerateSink, public std::enable_shared_from_this<CompletionCall> {
 public:
  static constexpr size_t kMaxPendingBytes = 8 << 20;

  struct Setup {
    ApiKind kind = ApiKind::kCompletion;
    bool stream = false;
    bool include_usage = false;
    bool logprobs = false;
    int32_t top_logprobs = 0;  // alternatives reported per token (the Service may compute more)
    std::string echo;          // text the completion starts with (echo: the prompt)
    std::string id;            // "cmpl-..." / "chatcmpl-..."
    int64_t created = 0;       // unix seconds
    std::string model;
    size_t max_response_bytes = SIZE_MAX;  // the largest whole (unstreamed) response
  };

  // Borrows `service` (for token texts) for its lifetime.
  CompletionCall(Setup setup, const Service& service, std::shared_ptr<Exchange> exchange,
                 std::function<void()> release);

  // On the strand, right after Service::generate returned: opens the event stream unless the request already ended.
  void begin();

  void on_chunk(GenerateChunk chunk) override;
  void on_done(Expected<GenerateSummary> result) override;
  bool cancelled() const override;

 private:
  void deliver(GenerateChunk chunk);
  void finish(Expected<GenerateSummary> result);
  void open_stream();
  void answer_error(const ApiError& error);
  std::vector<TokenLogprobs> token_logprobs(const GenerateChunk& chunk) const;
  std::string token_bytes(int32_t id) const;

  Setup setup_;
  const Service& service_;
  std::shared_ptr<Exchange> exchange_;
  std::function<void()> release_;
  ResponseEncoder encoder_;
  std::atomic<bool> done_{false};        // on_done was called
  std::atomic<bool> too_slow_{false};    // the client stopped reading
  std::atomic<bool> too_large_{false};   // without streaming: the answer would pass max_response_bytes
  bool stream_open_ = false;             // strand: the event stream's headers are queued
  std::string text_;                     // strand, without streaming: the completion so far
  std::vector<TokenLogprobs> logprobs_;  // strand, without streaming
  size_t text_bytes_ = 0;                // strand, without streaming: json_string_size of text_
  size_t logprobs_bytes_ = 0;            // strand, without streaming: logprobs_size_bound of logprobs_, summed
};

// A fresh id for a response: `prefix` and 24 random hex digits ("chatcmpl-3f9a...").
std::string new_response_id(const char* prefix);

}  // namespace kestrel::daemon::http
