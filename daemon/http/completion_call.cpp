// CompletionCall (completion_call.h).
#include "daemon/http/completion_call.h"

#include <cstdint>
#include <cstdio>
#include <random>
#include <utility>

namespace kestrel::daemon::http {

std::string new_response_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[25];
  std::snprintf(hex, sizeof hex, "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return std::string(prefix) + hex;
}

CompletionCall::CompletionCall(Setup setup, const Service& service, std::shared_ptr<Exchange> exchange,
                               std::function<void()> release)
    : setup_(std::move(setup)),
      service_(service),
      exchange_(std::move(exchange)),
      release_(std::move(release)),
      encoder_(setup_.kind, setup_.id, setup_.created, setup_.model, setup_.include_usage, setup_.logprobs) {
  text_ = setup_.echo;
  text_bytes_ = json_string_size(text_);
}

void CompletionCall::begin() {
  if (setup_.stream && !done_.load(std::memory_order_acquire)) open_stream();
}

void CompletionCall::on_chunk(GenerateChunk chunk) {
  exchange_->post([self = shared_from_this(), chunk = std::move(chunk)]() mutable { self->deliver(std::move(chunk)); });
}

void CompletionCall::on_done(Expected<GenerateSummary> result) {
  done_.store(true, std::memory_order_release);
  exchange_->post(
      [self = shared_from_this(), result = std::move(result)]() mutable { self->finish(std::move(result)); });
}

bool CompletionCall::cancelled() const {
  return too_slow_.load(std::memory_order_relaxed) || too_large_.load(std::memory_order_relaxed) ||
         exchange_->peer_gone();
}

std::string CompletionCall::token_bytes(int32_t id) const {
  // One token: at most its piece, which the vocabulary bounds.
  Expected<std::string> bytes = service_.detokenize({id}, SIZE_MAX);
  return bytes ? std::move(bytes).value() : std::string();
}

std::vector<TokenLogprobs> CompletionCall::token_logprobs(const GenerateChunk& chunk) const {
  std::vector<TokenLogprobs> out;
  if (!setup_.logprobs) return out;
  out.reserve(chunk.logprobs.size());
  for (const StepResult& s : chunk.logprobs) {
    TokenLogprobs t;
    t.bytes = token_bytes(s.token);
    t.logprob = s.logprob;
    const size_t n = std::min(s.top.size(), static_cast<size_t>(setup_.top_logprobs));
    for (size_t i = 0; i < n; ++i) t.top.emplace_back(token_bytes(s.top[i].id), s.top[i].logprob);
    out.push_back(std::move(t));
  }
  return out;
}

void CompletionCall::open_stream() {
  if (stream_open_) return;
  stream_open_ = true;
  exchange_->start_events();
  if (std::string open = encoder_.open_event(); !open.empty()) exchange_->send_event(std::move(open));
  if (!setup_.echo.empty()) exchange_->send_event(encoder_.delta_event(setup_.echo, {}));
}

void CompletionCall::deliver(GenerateChunk chunk) {
  std::vector<TokenLogprobs> logprobs = token_logprobs(chunk);
  if (!setup_.stream) {
    if (too_large_.load(std::memory_order_relaxed)) return;
    // The chunk's text joins text_ inside the same quotes.
    size_t text_bytes = text_bytes_ + json_string_size(chunk.text) - 2;
    size_t logprobs_bytes = logprobs_bytes_;
    for (const TokenLogprobs& t : logprobs) logprobs_bytes += logprobs_size_bound(t);
    if (encoder_.body_size_bound(text_bytes, logprobs_bytes) > setup_.max_response_bytes) {
      too_large_.store(true, std::memory_order_relaxed);  // the engine stops at its next tick
      return;
    }
    text_bytes_ = text_bytes;
    logprobs_bytes_ = logprobs_bytes;
    text_ += chunk.text;
    for (TokenLogprobs& t : logprobs) logprobs_.push_back(std::move(t));
    return;
  }
  if (exchange_->peer_gone()) return;
  open_stream();
  if (!chunk.text.empty() || !logprobs.empty()) exchange_->send_event(encoder_.delta_event(chunk.text, logprobs));
  if (exchange_->pending_bytes() > kMaxPendingBytes) too_slow_.store(true, std::memory_order_relaxed);
}

void CompletionCall::answer_error(const ApiError& error) {
  if (stream_open_) {
    exchange_->send_event(sse_event(error_body(error)));
    exchange_->send_event(std::string(kSseDone));
    exchange_->end_events();
    return;
  }
  Response r;
  r.status = error.status;
  r.body = error_body(error);
  exchange_->respond(std::move(r));
}

void CompletionCall::finish(Expected<GenerateSummary> result) {
  auto release = std::move(release_);
  if (release) release();
  if (!result && result.error().code == ErrorCode::kCancelled && too_slow_.load(std::memory_order_relaxed)) {
    ApiError e = ApiError::from_error(make_error(
        ErrorCode::kResourceExhausted, "the client stopped reading the stream; the generation was cancelled"));
    answer_error(e);  // queued behind what the client does not read: the connection closes when it times out
    return;
  }
  if (too_large_.load(std::memory_order_relaxed)) {
    return answer_error(ApiError::invalid(
        "max_tokens",
        "the response would pass " + std::to_string(setup_.max_response_bytes) +
            " bytes, the most kestreld keeps for a response that is not streamed; stream it (\"stream\": true), or "
            "ask for fewer tokens (max_tokens) or alternatives (top_logprobs)",
        "response_too_large"));
  }
  if (!result) return answer_error(ApiError::from_error(result.error()));
  const std::string_view finish = finish_reason_text(result->reason);
  if (finish.empty()) {
    const std::string why = result->reason == FinishReason::kShutdown
                                ? (result->message.empty() ? std::string("kestreld is shutting down") : result->message)
                                : std::string("the request was aborted");
    return answer_error(ApiError::from_error(make_error(
        ErrorCode::kUnavailable,
        "the generation was cut short after " + std::to_string(result->completion_tokens) + " tokens: " + why)));
  }
  const Usage usage{result->prompt_tokens, result->completion_tokens};
  if (!setup_.stream) {
    Response r;
    r.body = encoder_.body(text_, logprobs_, finish, usage);
    exchange_->respond(std::move(r));
    return;
  }
  open_stream();
  exchange_->send_event(encoder_.finish_event(finish));
  if (setup_.include_usage) exchange_->send_event(encoder_.usage_event(usage));
  exchange_->send_event(std::string(kSseDone));
  exchange_->end_events();
}

}  // namespace kestrel::daemon::http
