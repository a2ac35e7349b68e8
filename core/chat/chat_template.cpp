// ChatTemplate: the public face of the Jinja interpreter (chat_template.h).
#include "core/chat/chat_template.h"

#include <exception>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/chat/jinja_eval.h"
#include "core/chat/jinja_parser.h"
#include "core/chat/jinja_text.h"

namespace kestrel::chat {

namespace {

constexpr int kMaxJsonDepth = 512;

template <class Json>
Expected<jinja::Value> to_value(const Json& j, int depth) {
  using jinja::Value;
  if (depth > kMaxJsonDepth) return make_error(ErrorCode::kInvalidArgument, "the context is nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return make_error(ErrorCode::kUnsupported, "an integer in the context beyond 64 bits: " + std::to_string(u));
      }
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = j.template get_ref<const std::string&>();
      if (!jinja::valid_utf8(s)) return make_error(ErrorCode::kInvalidArgument, "a string in the context is not UTF-8");
      return Value::string(s);
    }
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) {
        KESTREL_TRY_ASSIGN(Value v, to_value(item, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      jinja::Dict d;
      d.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!jinja::valid_utf8(it.key()))
          return make_error(ErrorCode::kInvalidArgument, "a key in the context is not UTF-8");
        KESTREL_TRY_ASSIGN(Value v, to_value(it.value(), depth + 1));
        d.entries.emplace_back(Value::string(it.key()), std::move(v));
      }
      return Value::dict(std::move(d));
    }
    default: return make_error(ErrorCode::kInvalidArgument, "the context holds a value JSON cannot (binary)");
  }
}

template <class Json>
Expected<std::string> render_json(const jinja::Program& program, const Json& context) {
  try {
    if (!context.is_object())
      return make_error(ErrorCode::kInvalidArgument, "the chat template context must be an object");
    KESTREL_TRY_ASSIGN(jinja::Value globals, to_value(context, 0));
    jinja::Evaluator ev(program, globals.dict());
    return ev.render();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kResourceExhausted, std::string("rendering the chat template failed: ") + e.what());
  }
}

}  // namespace

Expected<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  try {
    KESTREL_TRY_ASSIGN(jinja::Program program, jinja::parse_program(source));
    return ChatTemplate(std::make_shared<const jinja::Program>(std::move(program)));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kResourceExhausted, std::string("parsing the chat template failed: ") + e.what());
  }
}

Expected<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  return render_json(*program_, context);
}

Expected<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render_json(*program_, context);
}

}  // namespace kestrel::chat
