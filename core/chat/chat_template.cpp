// ChatTemplate: the public face of the Jinja interpreter (chat_template.h).
#include "core/chat/chat_template.h"

#include <exception>
#include <nlohmann/json.hpp>

#include "core/chat/jinja_eval.h"
#include "core/chat/jinja_json.h"
#include "core/chat/jinja_parser.h"

namespace kestrel::chat {

namespace {

template <class Json>
Expected<std::string> render_json(const jinja::Program& program, const Json& context) {
  try {
    if (!context.is_object())
      return make_error(ErrorCode::kInvalidArgument, "the chat template context must be an object");
    size_t text_bytes = 0;
    KESTREL_TRY_ASSIGN(jinja::Value globals, jinja::value_from_json(context, &text_bytes));
    jinja::Evaluator ev(program, globals.dict());
    return ev.render(text_bytes + text_bytes / 8 + 4096);
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
