// The response side of the OpenAI-compatible API (docs/http.md): the JSON of completions and chat completions,
// whole (`object` "text_completion" / "chat.completion") and as server-sent events ("chat.completion.chunk"; the
// legacy endpoint streams "text_completion" objects), the usage counts, the log-probabilities, and SSE framing.
//
// A stream is: (chat) a first event with delta {"role": "assistant", "content": ""}; one event per piece of text
// (with its tokens' log-probabilities when asked); an event with the finish_reason and an empty delta; with
// stream_options.include_usage an event with "choices": [] and the usage (every earlier event then carries
// "usage": null, as OpenAI's do); then `data: [DONE]`. An error after the stream started is one event
// {"error": {...}} followed by `data: [DONE]`.
//
// Log-probabilities: -inf (a token the sampler could never pick) is written as -9999.0, as OpenAI does, since JSON
// has no infinity. Token strings are the token's bytes with invalid UTF-8 replaced by U+FFFD; the chat form also
// carries the exact `bytes`. The legacy form's text_offset counts Unicode code points of the token strings.
//
// A ResponseEncoder belongs to one request; not thread-safe (the connection's strand calls it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/engine/service.h"
#include "daemon/http/api_error.h"
#include "daemon/http/json_fields.h"
#include "daemon/http/openai_request.h"

namespace kestrel::daemon::http {

// One sampled token with its log-probability and the most likely alternatives (exact token bytes).
struct TokenLogprobs {
  std::string bytes;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;
};

struct Usage {
  uint32_t prompt_tokens = 0, completion_tokens = 0;
};

// "stop" for a stop token or stop string, "length" for max_tokens or a full context; "" for kAborted and kShutdown
// (which the caller answers as an error: the generation was cut short by an abort or by the daemon's shutdown).
std::string_view finish_reason_text(FinishReason reason);

// Sizes of a whole response, known before it is built (OpenAiApi and CompletionCall check them against
// ApiOptions::max_response_bytes). json_string_size: exactly the bytes of `bytes` as a JSON string (quotes, escapes,
// each invalid UTF-8 byte as U+FFFD). logprobs_size_bound: at least what one token's log-probabilities add to
// either form (chat or legacy). ResponseEncoder::body_size_bound: at least body()'s size for text and log-probabilities
// of those sizes.
size_t json_string_size(std::string_view bytes);
size_t logprobs_size_bound(const TokenLogprobs& t);

// "data: <json>\n\n"
std::string sse_event(std::string_view json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

class ResponseEncoder {
 public:
  // `id` e.g. "chatcmpl-1f..."; `created` unix seconds; `logprobs`: the request asked for log-probabilities.
  ResponseEncoder(ApiKind kind, std::string id, int64_t created, std::string model, bool include_usage, bool logprobs);

  // Streaming: the opening event (chat: the assistant role; completions: "" = none), a piece of text, the finish,
  // the usage (only when include_usage), each already framed as an SSE event.
  std::string open_event() const;
  std::string delta_event(std::string_view text, std::span<const TokenLogprobs> logprobs);
  std::string finish_event(std::string_view finish_reason) const;
  std::string usage_event(const Usage& usage) const;

  // At least body()'s size for a text of json_string_size `text_bytes` and log-probabilities of
  // logprobs_size_bound sum `logprobs_bytes`.
  size_t body_size_bound(size_t text_bytes, size_t logprobs_bytes) const;

  // The whole response of a request without streaming.
  std::string body(std::string_view text, std::span<const TokenLogprobs> logprobs, std::string_view finish_reason,
                   const Usage& usage);

 private:
  nlohmann::ordered_json envelope(bool chunk) const;
  nlohmann::ordered_json choice(nlohmann::ordered_json payload, const nlohmann::ordered_json& logprobs,
                                std::string_view finish_reason) const;
  nlohmann::ordered_json logprobs_json(std::span<const TokenLogprobs> logprobs);

  ApiKind kind_;
  std::string id_, model_;
  int64_t created_;
  bool include_usage_, logprobs_;
  int64_t text_offset_ = 0;  // code points of token strings so far (legacy text_offset)
};

// GET /v1/models: the list holding the one model served; GET /v1/models/{id}: that model.
std::string models_body(const std::string& model_id, int64_t created);
std::string model_body(const std::string& model_id, int64_t created);

}  // namespace kestrel::daemon::http
