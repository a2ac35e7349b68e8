// ChatTemplate: renders a conversation with the Jinja chat template a GGUF carries (tokenizer.chat_template), giving
// the same text as Hugging Face transformers' apply_chat_template (jinja2 with trim_blocks, lstrip_blocks, its
// tojson and raise_exception), for the templates of the Qwen3 / Qwen3.5 / Qwen3-Next family and any other template
// that stays within the interpreter's Jinja subset (core/chat/jinja_parser.h, jinja_builtins.h, docs/chat.md).
//
//   KESTREL_TRY_ASSIGN(auto tmpl, chat::ChatTemplate::parse(vocab.chat_template));   // at model load
//   nlohmann::ordered_json ctx = {{"messages", messages}, {"add_generation_prompt", true}};
//   KESTREL_TRY_ASSIGN(std::string prompt, tmpl.render(ctx));                         // per request
//
// parse() refuses, at load, a template that uses a construct the interpreter does not implement (kUnsupported,
// naming the construct and its line) and a malformed one (kInvalidArgument with the line). render() takes the
// context as the template's globals: messages (OpenAI-style list of {role, content, reasoning_content?, tool_calls?,
// tool_call_id?, name?}), tools (list, may be absent), add_generation_prompt (bool), enable_thinking (bool, may be
// absent), bos_token, eos_token, or anything else the template reads. Render errors name the construct and template
// line: kInvalidArgument for what the conversation does wrong in the template's eyes (its raise_exception, a
// TypeError, an undefined value used), kUnsupported for Python behaviour the interpreter does not implement,
// kResourceExhausted past the output limit (256 MiB). Strings must be valid UTF-8 (kInvalidArgument otherwise).
//
// Key order: Python keeps a JSON object's keys in the order the client sent them and `tojson` writes them in that
// order (tool definitions, tool-call arguments). nlohmann::json sorts keys; nlohmann::ordered_json keeps them. Render
// from an ordered_json (parse requests with nlohmann::ordered_json::parse) to match transformers byte for byte.
//
// Ownership and threads: a ChatTemplate owns its parsed template, is immutable, cheap to copy (shared), and render()
// may run on any number of threads at once. No exception escapes either function.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "core/base/expected.h"

namespace kestrel::chat {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses the template source; an error (kUnsupported / kInvalidArgument) naming what it cannot render.
  static Expected<ChatTemplate> parse(std::string_view source);
  // Renders with `context` as the Jinja globals (see above). Errors name the construct and template line.
  Expected<std::string> render(const nlohmann::json& context) const;
  // The same, keeping the context's key order (what transformers sees).
  Expected<std::string> render(const nlohmann::ordered_json& context) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace kestrel::chat
