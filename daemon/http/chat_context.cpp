// OpenAI messages → chat template context (chat_context.h).
#include "daemon/http/chat_context.h"

#include <utility>

namespace kestrel::daemon::http {
namespace {

FieldError read_content(const Json& v, const std::string& param, const std::string& role, std::string* out) {
  out->clear();
  if (v.is_null()) {
    if (role == "assistant") return std::nullopt;  // a turn that only calls tools
    return ApiError::invalid(param, param + " is null; a " + role + " message needs content");
  }
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) {
    return ApiError::invalid(param, param + " must be a string or an array of content parts, got " + describe_value(v));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = param + "[" + std::to_string(i) + "]";
    const Json& p = v[i];
    if (FieldError e = require_object(p, part)) return e;
    const auto type = p.find("type");
    if (type == p.end() || !type->is_string()) {
      return ApiError::invalid(part + ".type", part + " needs a string type (\"text\"), got " + describe_value(p));
    }
    if (*type != "text") {
      return ApiError::unsupported(
          part + ".type", "content parts of type " + type->dump() + " are not supported: the model reads text only");
    }
    for (const auto& [key, value] : p.items()) {
      if (key != "type" && key != "text") {
        return ApiError::invalid(
            part + "." + key,
            "Unrecognized request argument supplied: " + part + "." + key + " (a text part has type and text)",
            "unknown_parameter");
      }
    }
    std::string text;
    const auto t = p.find("text");
    if (t == p.end()) return ApiError::invalid(part + ".text", part + " has no text");
    if (FieldError e = read_string(*t, part + ".text", &text)) return e;
    if (i > 0) *out += "\n";
    *out += text;
  }
  return std::nullopt;
}

FieldError read_tool_calls(const Json& v, const std::string& param, Json* out) {
  if (!v.is_array()) return ApiError::invalid(param, param + " must be an array, got " + describe_value(v));
  *out = Json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string call = param + "[" + std::to_string(i) + "]";
    const Json& c = v[i];
    if (FieldError e = require_object(c, call)) return e;
    Json converted = Json::object();
    for (const auto& [key, value] : c.items()) {
      if (key == "id") {
        std::string id;
        if (FieldError e = read_string(value, call + ".id", &id)) return e;
        converted["id"] = id;
      } else if (key == "type") {
        if (value != "function") {
          return ApiError::unsupported(call + ".type",
                                       call + ".type must be \"function\", got " + describe_value(value));
        }
        converted["type"] = "function";
      } else if (key == "function") {
        if (FieldError e = require_object(value, call + ".function")) return e;
        std::string name;
        const auto n = value.find("name");
        if (n == value.end()) return ApiError::invalid(call + ".function.name", call + ".function has no name");
        if (FieldError e = read_string(*n, call + ".function.name", &name)) return e;
        Json arguments = Json::object();
        if (const auto a = value.find("arguments"); a != value.end() && !a->is_null()) {
          std::string text;
          if (FieldError e = read_string(*a, call + ".function.arguments", &text)) return e;
          Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
          arguments = parsed.is_object() ? std::move(parsed) : Json(text);
        }
        for (const auto& [fkey, fvalue] : value.items()) {
          if (fkey != "name" && fkey != "arguments") {
            return ApiError::invalid(call + ".function." + fkey,
                                     "Unrecognized request argument supplied: " + call + ".function." + fkey,
                                     "unknown_parameter");
          }
        }
        converted["function"] = {{"name", name}, {"arguments", std::move(arguments)}};
      } else {
        return ApiError::invalid(call + "." + key, "Unrecognized request argument supplied: " + call + "." + key,
                                 "unknown_parameter");
      }
    }
    if (!converted.contains("function")) return ApiError::invalid(call + ".function", call + " has no function");
    out->push_back(std::move(converted));
  }
  return std::nullopt;
}

FieldError read_message(const Json& m, const std::string& param, Json* out) {
  if (FieldError e = require_object(m, param)) return e;
  const auto role_it = m.find("role");
  if (role_it == m.end()) return ApiError::invalid(param + ".role", param + " has no role");
  std::string role;
  if (FieldError e = read_string(*role_it, param + ".role", &role)) return e;
  if (role == "developer") role = "system";
  if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
    return ApiError::invalid(param + ".role", param + ".role must be system, developer, user, assistant or tool, got " +
                                                  describe_value(*role_it));
  }
  *out = Json{{"role", role}, {"content", ""}};
  bool have_content = false;
  for (const auto& [key, value] : m.items()) {
    const std::string field = param + "." + key;
    if (key == "role") continue;
    if (key == "content") {
      std::string content;
      if (FieldError e = read_content(value, field, role, &content)) return e;
      (*out)["content"] = std::move(content);
      have_content = true;
      continue;
    }
    if (value.is_null()) continue;
    std::string text;
    if (key == "name") {
      if (FieldError e = read_string(value, field, &text)) return e;
      (*out)["name"] = std::move(text);
    } else if (key == "reasoning_content" && role == "assistant") {
      if (FieldError e = read_string(value, field, &text)) return e;
      (*out)["reasoning_content"] = std::move(text);
    } else if (key == "tool_calls" && role == "assistant") {
      Json calls;
      if (FieldError e = read_tool_calls(value, field, &calls)) return e;
      (*out)["tool_calls"] = std::move(calls);
    } else if (key == "tool_call_id" && role == "tool") {
      if (FieldError e = read_string(value, field, &text)) return e;
      (*out)["tool_call_id"] = std::move(text);
    } else {
      return ApiError::invalid(field,
                               "Unrecognized request argument supplied: " + field + " (a " + role +
                                   " message accepts role, content, name" +
                                   (role == "assistant" ? ", reasoning_content, tool_calls"
                                    : role == "tool"    ? ", tool_call_id"
                                                        : "") +
                                   ")",
                               "unknown_parameter");
    }
  }
  if (!have_content && !(role == "assistant" && out->contains("tool_calls"))) {
    return ApiError::invalid(param + ".content", param + " has no content");
  }
  return std::nullopt;
}

}  // namespace

FieldError read_chat_messages(const Json& messages, int32_t max_messages, Json* out) {
  if (!messages.is_array()) {
    return ApiError::invalid("messages", "messages must be an array of messages, got " + describe_value(messages));
  }
  if (messages.empty()) return ApiError::invalid("messages", "messages is empty; send at least one message");
  if (std::ssize(messages) > max_messages) {
    return ApiError::invalid("messages", "messages holds " + std::to_string(messages.size()) + " messages; at most " +
                                             std::to_string(max_messages) + " are allowed");
  }
  *out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    Json m;
    if (FieldError e = read_message(messages[i], "messages[" + std::to_string(i) + "]", &m)) return e;
    out->push_back(std::move(m));
  }
  return std::nullopt;
}

Json template_context(const Json& request_context, const std::string& bos_token, const std::string& eos_token) {
  Json context = request_context;
  context["bos_token"] = bos_token;
  context["eos_token"] = eos_token;
  return context;
}

}  // namespace kestrel::daemon::http
