// OpenAI request bodies → CompletionRequest (openai_request.h).
#include "daemon/http/openai_request.h"

#include <cmath>
#include <limits>
#include <utility>

#include "core/sampler/sampling_params.h"
#include "daemon/http/chat_context.h"

namespace kestrel::daemon::http {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// OpenAI fields kestreld knows and does not implement: any value but null is refused with the reason.
struct Unsupported {
  const char* name;
  const char* why;
};
constexpr Unsupported kUnsupportedChat[] = {
    {"functions",
     "functions (the legacy form of tools) are not supported: kestreld does not parse calls out of the "
     "model's output"},
    {"function_call", "function_call is not supported: kestreld does not parse calls out of the model's output"},
    {"audio", "audio output is not supported: kestreld serves text"},
    {"modalities", "modalities is not supported: kestreld serves text only"},
    {"prediction", "predicted outputs are not supported"},
    {"reasoning_effort",
     "reasoning_effort is not supported; use chat_template_kwargs.enable_thinking to switch thinking on or off"},
    {"service_tier", "service tiers are not supported"},
    {"metadata", "metadata is not supported: kestreld stores no completions"},
    {"web_search_options", "web search is not supported"},
    {"verbosity", "verbosity is not supported"},
    {"prompt_cache_key", "prompt_cache_key is not supported"},
    {"safety_identifier", "safety_identifier is not supported"},
};

const char* unsupported_reason(const std::string& key) {
  for (const Unsupported& u : kUnsupportedChat) {
    if (key == u.name) return u.why;
  }
  return nullptr;
}

ApiError unknown_field(const std::string& key, const char* endpoint, const char* accepted) {
  return ApiError::invalid(
      key, "Unrecognized request argument supplied: " + key + " (" + endpoint + " accepts: " + accepted + ")",
      "unknown_parameter");
}

constexpr const char* kCompletionFields =
    "prompt, echo, logprobs, best_of, suffix, and model, max_tokens, temperature, top_p, top_k, min_p, seed, stop, "
    "presence_penalty, frequency_penalty, repetition_penalty, n, stream, stream_options, user, logit_bias, ignore_eos";
constexpr const char* kChatFields =
    "messages, max_completion_tokens, logprobs, top_logprobs, tools, tool_choice, parallel_tool_calls, "
    "response_format, chat_template_kwargs, store, and model, max_tokens, temperature, top_p, top_k, min_p, seed, "
    "stop, presence_penalty, frequency_penalty, repetition_penalty, n, stream, stream_options, user, logit_bias, "
    "ignore_eos";

FieldError read_float(const Json& v, const std::string& param, double lo, double hi, std::optional<float>* out) {
  double d = 0.0;
  if (FieldError e = read_number(v, param, lo, hi, &d)) return e;
  *out = static_cast<float>(d);
  return std::nullopt;
}

FieldError read_stop(const Json& v, const RequestLimits& limits, std::vector<std::string>* out) {
  auto one = [&](const Json& s, const std::string& param) -> FieldError {
    std::string text;
    if (FieldError e = read_string(s, param, &text)) return e;
    if (text.empty()) return ApiError::invalid(param, param + " is an empty string; a stop string needs a character");
    if (std::ssize(text) > limits.max_stop_bytes) {
      return ApiError::invalid(param, param + " is " + std::to_string(text.size()) + " bytes; the limit is " +
                                          std::to_string(limits.max_stop_bytes));
    }
    out->push_back(std::move(text));
    return std::nullopt;
  };
  out->clear();
  if (v.is_string()) return one(v, "stop");
  if (!v.is_array()) {
    return ApiError::invalid("stop", "stop must be a string or an array of strings, got " + describe_value(v));
  }
  if (std::ssize(v) > limits.max_stop) {
    return ApiError::invalid("stop", "stop has " + std::to_string(v.size()) + " strings; at most " +
                                         std::to_string(limits.max_stop) + " are allowed");
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (FieldError e = one(v[i], "stop[" + std::to_string(i) + "]")) return e;
  }
  return std::nullopt;
}

FieldError read_stream_options(const Json& v, CompletionRequest* out) {
  if (FieldError e = require_object(v, "stream_options")) return e;
  for (const auto& [key, value] : v.items()) {
    if (key == "include_usage") {
      if (value.is_null()) continue;
      if (FieldError e = read_bool(value, "stream_options.include_usage", &out->include_usage)) return e;
    } else {
      return ApiError::invalid(
          "stream_options." + key,
          "Unrecognized request argument supplied: stream_options." + key + " (stream_options accepts: include_usage)",
          "unknown_parameter");
    }
  }
  return std::nullopt;
}

// The fields both endpoints share. *handled = false when `key` is none of them.
FieldError read_common(const std::string& key, const Json& v, const RequestLimits& limits, CompletionRequest* out,
                       bool* handled) {
  *handled = true;
  SamplingOverrides& s = out->sampling;
  int64_t i = 0;
  if (key == "model") return read_string(v, key, &out->model);
  if (key == "max_tokens") {
    if (FieldError e = read_int(v, key, 1, kMaxInt32, &i)) return e;
    out->max_tokens = static_cast<int32_t>(i);
    return std::nullopt;
  }
  if (key == "temperature") return read_float(v, key, 0.0, kInf, &s.temperature);
  if (key == "top_p") {
    if (FieldError e = read_float(v, key, 0.0, 1.0, &s.top_p)) return e;
    if (*s.top_p <= 0.0f) return ApiError::invalid(key, "top_p must be greater than 0 and at most 1 (1 = off), got 0");
    return std::nullopt;
  }
  if (key == "top_k") {
    if (FieldError e = read_int(v, key, -1, kMaxInt32, &i)) return e;
    s.top_k = static_cast<int32_t>(i < 0 ? 0 : i);  // -1 (vLLM) and 0 both mean off
    return std::nullopt;
  }
  if (key == "min_p") return read_float(v, key, 0.0, 1.0, &s.min_p);
  if (key == "seed") {
    if (FieldError e = read_int(v, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &i)) {
      return e;
    }
    s.seed = static_cast<uint64_t>(i);  // a negative seed is a seed too: its two's complement bits
    return std::nullopt;
  }
  if (key == "stop") return read_stop(v, limits, &out->stop);
  if (key == "presence_penalty") return read_float(v, key, -kInf, kInf, &s.presence_penalty);
  if (key == "frequency_penalty") return read_float(v, key, -kInf, kInf, &s.frequency_penalty);
  if (key == "repetition_penalty") {
    if (FieldError e = read_float(v, key, 0.0, kInf, &s.repetition_penalty)) return e;
    if (*s.repetition_penalty <= 0.0f) {
      return ApiError::invalid(key, "repetition_penalty must be greater than 0 (1 = off), got 0");
    }
    return std::nullopt;
  }
  if (key == "n") {
    if (FieldError e = read_int(v, key, 1, kMaxInt32, &i)) return e;
    if (i > 1) {
      return ApiError::unsupported(key, "n = " + std::to_string(i) +
                                            " is not supported: kestreld returns one choice per request; send " +
                                            std::to_string(i) + " requests (with different seeds) instead");
    }
    return std::nullopt;
  }
  if (key == "stream") return read_bool(v, key, &out->stream);
  if (key == "stream_options") return read_stream_options(v, out);
  if (key == "user") {
    std::string user;  // an end-user id for the caller's records; it changes nothing in the output
    return read_string(v, key, &user);
  }
  if (key == "logit_bias") {
    if (FieldError e = require_object(v, key)) return e;
    if (!v.empty()) {
      return ApiError::unsupported(key, "logit_bias is not supported: kestreld's sampler has no per-token bias");
    }
    return std::nullopt;
  }
  if (key == "ignore_eos") return read_bool(v, key, &out->ignore_eos);
  *handled = false;
  return std::nullopt;
}

// A prompt of token ids: integers in [0, 2^31).
FieldError read_token_ids(const Json& v, const std::string& param, std::vector<int32_t>* out) {
  out->clear();
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t id = 0;
    if (FieldError e = read_int(v[i], param + "[" + std::to_string(i) + "]", 0, kMaxInt32, &id)) return e;
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

FieldError read_prompt(const Json& v, CompletionRequest* out) {
  const auto batch = [](size_t n) {
    return ApiError::unsupported("prompt", "prompt holds " + std::to_string(n) +
                                               " prompts; kestreld completes one prompt per request: send them "
                                               "one by one");
  };
  const ApiError empty = ApiError::invalid("prompt", "prompt is empty; give at least one character or token");
  if (v.is_string()) {
    out->prompt_text = v.get<std::string>();
    if (out->prompt_text.empty()) return empty;
    return std::nullopt;
  }
  if (!v.is_array()) {
    return ApiError::invalid(
        "prompt",
        "prompt must be a string, an array of token ids, or an array holding one of those, got " + describe_value(v));
  }
  if (v.empty()) return empty;
  if (v[0].is_string() || v[0].is_array()) {
    if (v.size() > 1) return batch(v.size());
    if (v[0].is_string()) return read_prompt(v[0], out);
    if (v[0].empty()) return empty;
    return read_token_ids(v[0], "prompt[0]", &out->prompt_tokens);
  }
  return read_token_ids(v, "prompt", &out->prompt_tokens);
}

FieldError read_response_format(const Json& v) {
  if (FieldError e = require_object(v, "response_format")) return e;
  const auto type = v.find("type");
  if (type == v.end() || !type->is_string()) {
    return ApiError::invalid("response_format", "response_format needs a string type, got " + describe_value(v));
  }
  if (*type != "text" || v.size() != 1) {
    return ApiError::unsupported("response_format",
                                 "response_format " + describe_value(v) +
                                     " is not supported: kestreld has no constrained decoding (only {\"type\": "
                                     "\"text\"} is accepted)");
  }
  return std::nullopt;
}

FieldError read_tool_choice(const Json& v) {
  if (v.is_string() && (v == "none" || v == "auto")) return std::nullopt;  // without tools, both mean "answer"
  return ApiError::unsupported("tool_choice", "tool_choice " + describe_value(v) +
                                                  " is not supported: kestreld does not parse tool calls out of "
                                                  "the model's output (\"none\" and \"auto\" are accepted)");
}

FieldError read_template_kwargs(const Json& v, Json* context) {
  if (FieldError e = require_object(v, "chat_template_kwargs")) return e;
  for (const auto& [key, value] : v.items()) {
    if (key != "enable_thinking") {
      return ApiError::unsupported(
          "chat_template_kwargs." + key,
          "chat_template_kwargs." + key + " is not supported (chat_template_kwargs accepts: enable_thinking)");
    }
    bool on = false;
    if (FieldError e = read_bool(value, "chat_template_kwargs.enable_thinking", &on)) return e;
    (*context)["enable_thinking"] = on;
  }
  return std::nullopt;
}

}  // namespace

FieldError parse_body(std::string_view text, Json* out) {
  try {
    *out = Json::parse(text);  // nlohmann reports where parsing failed only through its exception
  } catch (const Json::parse_error& e) {
    std::string what = e.what();
    if (const size_t tag = what.find("] "); what.starts_with("[json.exception") && tag != std::string::npos) {
      what.erase(0, tag + 2);
    }
    return ApiError::invalid("", "the request body is not valid JSON: " + what, "invalid_json");
  }
  if (!out->is_object()) {
    return ApiError::invalid("", "the request body must be a JSON object, got " + json_type_name(*out), "invalid_json");
  }
  return std::nullopt;
}

FieldError parse_completion_request(const Json& body, const RequestLimits& limits, CompletionRequest* out) {
  *out = CompletionRequest{};
  out->kind = ApiKind::kCompletion;
  bool have_prompt = false;
  for (const auto& [key, v] : body.items()) {
    if (v.is_null()) continue;  // null is "not given" for every optional field
    bool handled = false;
    if (FieldError e = read_common(key, v, limits, out, &handled)) return e;
    if (handled) continue;
    if (key == "prompt") {
      if (FieldError e = read_prompt(v, out)) return e;
      have_prompt = true;
    } else if (key == "echo") {
      if (FieldError e = read_bool(v, key, &out->echo)) return e;
    } else if (key == "logprobs") {
      int64_t n = 0;
      if (FieldError e = read_int(v, key, 0, SamplingParams::kMaxLogprobs, &n)) return e;
      out->logprobs = true;
      out->top_logprobs = static_cast<int32_t>(n);
    } else if (key == "best_of") {
      int64_t n = 0;
      if (FieldError e = read_int(v, key, 1, kMaxInt32, &n)) return e;
      if (n > 1) return ApiError::unsupported(key, "best_of > 1 is not supported: kestreld returns one completion");
    } else if (key == "suffix") {
      std::string suffix;
      if (FieldError e = read_string(v, key, &suffix)) return e;
      if (!suffix.empty()) return ApiError::unsupported(key, "suffix (fill in the middle) is not supported");
    } else {
      return unknown_field(key, "/v1/completions", kCompletionFields);
    }
  }
  if (!have_prompt) return ApiError::invalid("prompt", "prompt is required", "missing_required_parameter");
  if (out->echo && out->logprobs) {
    return ApiError::unsupported("echo",
                                 "echo with logprobs is not supported: kestreld reports no log-probabilities "
                                 "for prompt tokens");
  }
  return std::nullopt;
}

FieldError parse_chat_request(const Json& body, const RequestLimits& limits, CompletionRequest* out) {
  *out = CompletionRequest{};
  out->kind = ApiKind::kChat;
  out->chat_context = Json::object();
  bool have_messages = false;
  bool top_logprobs_given = false;
  std::optional<int32_t> max_completion_tokens;
  for (const auto& [key, v] : body.items()) {
    if (v.is_null()) continue;
    bool handled = false;
    if (FieldError e = read_common(key, v, limits, out, &handled)) return e;
    if (handled) continue;
    int64_t n = 0;
    if (key == "messages") {
      Json messages;
      if (FieldError e = read_chat_messages(v, limits.max_messages, &messages)) return e;
      out->chat_context["messages"] = std::move(messages);
      have_messages = true;
    } else if (key == "max_completion_tokens") {
      if (FieldError e = read_int(v, key, 1, kMaxInt32, &n)) return e;
      max_completion_tokens = static_cast<int32_t>(n);
    } else if (key == "logprobs") {
      if (FieldError e = read_bool(v, key, &out->logprobs)) return e;
    } else if (key == "top_logprobs") {
      if (FieldError e = read_int(v, key, 0, SamplingParams::kMaxLogprobs, &n)) return e;
      out->top_logprobs = static_cast<int32_t>(n);
      top_logprobs_given = true;
    } else if (key == "tools") {
      if (!v.is_array()) return ApiError::invalid(key, "tools must be an array, got " + describe_value(v));
      if (!v.empty()) {
        return ApiError::unsupported(key,
                                     "tools are not supported yet: kestreld does not parse tool calls out of the "
                                     "model's output, so it cannot honour them (tool messages and assistant "
                                     "tool_calls in the conversation are rendered)");
      }
    } else if (key == "tool_choice") {
      if (FieldError e = read_tool_choice(v)) return e;
    } else if (key == "parallel_tool_calls") {
      bool parallel = false;  // without tools there are no calls to run in parallel
      if (FieldError e = read_bool(v, key, &parallel)) return e;
    } else if (key == "response_format") {
      if (FieldError e = read_response_format(v)) return e;
    } else if (key == "chat_template_kwargs") {
      if (FieldError e = read_template_kwargs(v, &out->chat_context)) return e;
    } else if (key == "store") {
      bool store = false;
      if (FieldError e = read_bool(v, key, &store)) return e;
      if (store) return ApiError::unsupported(key, "store is not supported: kestreld keeps no completions");
    } else if (const char* why = unsupported_reason(key)) {
      return ApiError::unsupported(key, why);
    } else {
      return unknown_field(key, "/v1/chat/completions", kChatFields);
    }
  }
  if (!have_messages) return ApiError::invalid("messages", "messages is required", "missing_required_parameter");
  if (max_completion_tokens) {
    if (out->max_tokens && *out->max_tokens != *max_completion_tokens) {
      return ApiError::invalid("max_completion_tokens",
                               "max_tokens (" + std::to_string(*out->max_tokens) + ") and max_completion_tokens (" +
                                   std::to_string(*max_completion_tokens) + ") disagree; give one of them");
    }
    out->max_tokens = max_completion_tokens;
  }
  if (top_logprobs_given && !out->logprobs) {
    return ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true");
  }
  out->chat_context["add_generation_prompt"] = true;
  return std::nullopt;
}

}  // namespace kestrel::daemon::http
