// The chat template's input: an OpenAI `messages` list, checked and turned into the context the GGUF's
// tokenizer.chat_template is rendered with (core/chat/chat_template.h: messages, tools, add_generation_prompt,
// enable_thinking, bos_token, eos_token).
//
// Each message becomes {role, content, name?, reasoning_content?, tool_calls?, tool_call_id?}:
//   role         system, user, assistant or tool; "developer" (OpenAI's newer name for system) becomes system
//   content      a string; an array of text parts is joined with "\n" (as vLLM does); null (an assistant turn that
//                only calls tools) becomes ""; image, audio and file parts are refused (the models read text)
//   tool_calls   assistant only: [{id, type: "function", function: {name, arguments}}], arguments parsed from
//                its JSON string into an object when it is one (templates iterate over or re-serialise it)
//   tool_call_id tool only
// Anything else in a message is refused with an ApiError naming it ("messages[2].audio").
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "daemon/http/json_fields.h"

namespace kestrel::daemon::http {

// `messages` from a chat request → the context's messages (1..max_messages of them).
FieldError read_chat_messages(const Json& messages, int32_t max_messages, Json* out);

// The full template context: the request's part (messages, add_generation_prompt, enable_thinking when given) plus
// the model's bos_token and eos_token texts.
Json template_context(const Json& request_context, const std::string& bos_token, const std::string& eos_token);

}  // namespace kestrel::daemon::http
