// The request side of the OpenAI-compatible API (docs/http.md): the JSON bodies of POST /v1/completions and
// POST /v1/chat/completions, checked field by field and turned into one CompletionRequest.
//
// Every field the body carries must be one kestreld understands: an unknown field, a value of the wrong type or out
// of range, and a feature kestreld does not implement (n > 1, best_of > 1, tools, response_format other than text,
// logit_bias, suffix, audio, ...) are refused with an ApiError (400) naming the field, never ignored. Fields that
// change nothing in kestreld's output are accepted: `user`, `tool_choice` "none"/"auto" and `parallel_tool_calls`
// without tools, an empty `logit_bias`, `response_format` {"type": "text"}, `stream_options` without a stream.
// Extensions vLLM and llama-server accept too: top_k (-1 = off), min_p, repetition_penalty, ignore_eos, and for
// chat, chat_template_kwargs.enable_thinking.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/engine/service.h"
#include "daemon/http/json_fields.h"

namespace kestrel::daemon::http {

enum class ApiKind { kCompletion, kChat };

struct CompletionRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // as the client named it; "" when absent

  // kCompletion: the prompt as text, or as token ids when prompt_tokens is not empty.
  std::string prompt_text;
  std::vector<int32_t> prompt_tokens;
  bool echo = false;  // the completion's text starts with the prompt's

  // kChat: the chat template's context (chat_context.h) without bos_token / eos_token, which the server adds.
  Json chat_context;

  std::optional<int32_t> max_tokens;  // unset: 16 for completions (OpenAI's default), the context's room for chat
  SamplingOverrides sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the token counts
  bool logprobs = false;       // report the log-probability of each sampled token
  int32_t top_logprobs = 0;    // and of this many most likely alternatives (0..20)
};

struct RequestLimits {
  int32_t max_stop = 16;         // stop strings (kestrel.v1's RpcLimits)
  int32_t max_stop_bytes = 256;  // bytes per stop string
  int32_t max_messages = 4096;   // chat messages
};

// Parses a request body: 400 "the request body is not valid JSON: ..." for malformed JSON, or for anything but an
// object at the top.
FieldError parse_body(std::string_view text, Json* out);

// /v1/completions and /v1/chat/completions bodies (objects, from parse_body).
FieldError parse_completion_request(const Json& body, const RequestLimits& limits, CompletionRequest* out);
FieldError parse_chat_request(const Json& body, const RequestLimits& limits, CompletionRequest* out);

}  // namespace kestrel::daemon::http
