// OpenAI response JSON and server-sent events (openai_encode.h).
#include "daemon/http/openai_encode.h"

#include <cmath>
#include <utility>

#include "daemon/engine/text_stream.h"

namespace kestrel::daemon::http {
namespace {

// Responses keep their keys in OpenAI's order (id, object, created, model, choices, usage), easier to read.
using OJson = nlohmann::ordered_json;

constexpr double kNoProbability = -9999.0;  // OpenAI's stand-in for -inf

std::string dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }

std::string token_string(std::string_view bytes) {
  std::string out;
  append_utf8_sanitized(bytes, out);
  return out;
}

double logprob_value(float v) { return std::isfinite(v) ? static_cast<double>(v) : kNoProbability; }

OJson byte_list(std::string_view bytes) {
  OJson out = OJson::array();
  for (const char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

int64_t code_points(std::string_view utf8) {
  int64_t n = 0;
  for (const char c : utf8) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  }
  return n;
}

OJson usage_json(const Usage& u) {
  return OJson{{"prompt_tokens", u.prompt_tokens},
               {"completion_tokens", u.completion_tokens},
               {"total_tokens", static_cast<uint64_t>(u.prompt_tokens) + u.completion_tokens}};
}

}  // namespace

std::string_view finish_reason_text(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
    case FinishReason::kStopString: return "stop";
    case FinishReason::kMaxTokens:
    case FinishReason::kContextFull: return "length";
    case FinishReason::kAborted:
    case FinishReason::kShutdown: return "";
  }
  return "";
}

size_t json_string_size(std::string_view bytes) {
  std::string clean;
  append_utf8_sanitized(bytes, clean);
  size_t n = 2;  // the quotes
  for (const char ch : clean) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
      case '\\':
      case '\b':
      case '\f':
      case '\n':
      case '\r':
      case '\t': n += 2; break;
      default: n += c < 0x20 ? 6 : 1;  // other control characters as \u00XX
    }
  }
  return n;
}

namespace {
// The longest a log-probability is written (-9999.0, or a double in full: "-1.2345678901234567e-308").
constexpr size_t kNumberBytes = 24;
// One entry's keys, brackets and commas in either form, beyond its string, number and byte list: chat
// {"token":,"logprob":,"bytes":[],"top_logprobs":[]}, legacy a string, a number, an object and an offset in four
// arrays. Each alternative adds {"token":,"logprob":,"bytes":[]} (chat) or "":, (legacy).
constexpr size_t kEntryBytes = 64 + 20;  // the 20: a legacy text_offset
constexpr size_t kAlternativeBytes = 40;
// The byte list of `bytes`: up to three digits and a comma per byte.
size_t byte_list_size(std::string_view bytes) { return 4 * bytes.size(); }
}  // namespace

size_t logprobs_size_bound(const TokenLogprobs& t) {
  size_t n = kEntryBytes + kNumberBytes + json_string_size(t.bytes) + byte_list_size(t.bytes);
  for (const auto& [bytes, lp] : t.top) {
    n += kAlternativeBytes + kNumberBytes + json_string_size(bytes) + byte_list_size(bytes);
  }
  return n;
}

size_t ResponseEncoder::body_size_bound(size_t text_bytes, size_t logprobs_bytes) const {
  // The envelope, the choice's keys, a finish reason and the usage object (three integers of up to 20 digits) take
  // under 400 bytes beside the id and the model; the legacy form adds its four logprobs keys.
  constexpr size_t kFixedBytes = 512;
  return kFixedBytes + json_string_size(id_) + json_string_size(model_) + text_bytes + logprobs_bytes;
}

std::string sse_event(std::string_view json) {
  std::string out;
  out.reserve(json.size() + 8);
  out += "data: ";
  out += json;
  out += "\n\n";
  return out;
}

ResponseEncoder::ResponseEncoder(ApiKind kind, std::string id, int64_t created, std::string model, bool include_usage,
                                 bool logprobs)
    : kind_(kind),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      include_usage_(include_usage),
      logprobs_(logprobs) {}

OJson ResponseEncoder::envelope(bool chunk) const {
  const char* object =
      kind_ == ApiKind::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return OJson{{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

OJson ResponseEncoder::choice(OJson payload, const OJson& logprobs, std::string_view finish_reason) const {
  OJson c = OJson{{"index", 0}};
  for (auto& [key, value] : payload.items()) c[key] = std::move(value);
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish_reason.empty() ? OJson(nullptr) : OJson(std::string(finish_reason));
  return c;
}

OJson ResponseEncoder::logprobs_json(std::span<const TokenLogprobs> logprobs) {
  if (!logprobs_) return nullptr;
  if (kind_ == ApiKind::kChat) {
    OJson content = OJson::array();
    for (const TokenLogprobs& t : logprobs) {
      OJson top = OJson::array();
      for (const auto& [bytes, lp] : t.top) {
        top.push_back({{"token", token_string(bytes)}, {"logprob", logprob_value(lp)}, {"bytes", byte_list(bytes)}});
      }
      content.push_back({{"token", token_string(t.bytes)},
                         {"logprob", logprob_value(t.logprob)},
                         {"bytes", byte_list(t.bytes)},
                         {"top_logprobs", std::move(top)}});
    }
    return OJson{{"content", std::move(content)}};
  }
  OJson tokens = OJson::array(), token_logprobs = OJson::array(), top_logprobs = OJson::array(),
        offsets = OJson::array();
  for (const TokenLogprobs& t : logprobs) {
    const std::string text = token_string(t.bytes);
    tokens.push_back(text);
    token_logprobs.push_back(logprob_value(t.logprob));
    OJson top = OJson::object();
    for (const auto& [bytes, lp] : t.top) top[token_string(bytes)] = logprob_value(lp);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset_);
    text_offset_ += code_points(text);
  }
  return OJson{{"tokens", std::move(tokens)},
               {"token_logprobs", std::move(token_logprobs)},
               {"top_logprobs", std::move(top_logprobs)},
               {"text_offset", std::move(offsets)}};
}

std::string ResponseEncoder::open_event() const {
  if (kind_ != ApiKind::kChat) return "";
  OJson j = envelope(true);
  j["choices"] = OJson::array({choice(OJson{{"delta", {{"role", "assistant"}, {"content", ""}}}}, nullptr, "")});
  if (include_usage_) j["usage"] = nullptr;
  return sse_event(dump(j));
}

std::string ResponseEncoder::delta_event(std::string_view text, std::span<const TokenLogprobs> logprobs) {
  OJson j = envelope(true);
  OJson payload = kind_ == ApiKind::kChat ? OJson{{"delta", {{"content", text}}}} : OJson{{"text", text}};
  j["choices"] = OJson::array({choice(std::move(payload), logprobs_json(logprobs), "")});
  if (include_usage_) j["usage"] = nullptr;
  return sse_event(dump(j));
}

std::string ResponseEncoder::finish_event(std::string_view finish_reason) const {
  OJson j = envelope(true);
  OJson payload = kind_ == ApiKind::kChat ? OJson{{"delta", OJson::object()}} : OJson{{"text", ""}};
  j["choices"] = OJson::array({choice(std::move(payload), nullptr, finish_reason)});
  if (include_usage_) j["usage"] = nullptr;
  return sse_event(dump(j));
}

std::string ResponseEncoder::usage_event(const Usage& usage) const {
  OJson j = envelope(true);
  j["choices"] = OJson::array();
  j["usage"] = usage_json(usage);
  return sse_event(dump(j));
}

std::string ResponseEncoder::body(std::string_view text, std::span<const TokenLogprobs> logprobs,
                                  std::string_view finish_reason, const Usage& usage) {
  OJson j = envelope(false);
  OJson payload =
      kind_ == ApiKind::kChat ? OJson{{"message", {{"role", "assistant"}, {"content", text}}}} : OJson{{"text", text}};
  j["choices"] = OJson::array({choice(std::move(payload), logprobs_json(logprobs), finish_reason)});
  j["usage"] = usage_json(usage);
  return dump(j);
}

namespace {
OJson model_json(const std::string& model_id, int64_t created) {
  return OJson{{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "kestrel"}};
}
}  // namespace

std::string model_body(const std::string& model_id, int64_t created) { return dump(model_json(model_id, created)); }

std::string models_body(const std::string& model_id, int64_t created) {
  return dump(OJson{{"object", "list"}, {"data", OJson::array({model_json(model_id, created)})}});
}

}  // namespace kestrel::daemon::http
