// ChatConversation: the state of `kestrel chat` apart from the daemon — the messages so far, rendered with the
// model's chat template (core/chat), and the text the daemon session already holds.
//
// Each user turn renders the whole conversation with add_generation_prompt. When the session's text is a prefix of
// that rendering, only the rest is sent; otherwise (the template renders history differently from what the session
// holds, e.g. Qwen3 drops the reasoning of earlier answers) the session must be reset and the whole rendering sent.
// The answer is recorded as the assistant message's content (the text the model generated, <think> block
// included, for the template to split), and the session's text grows by the exact bytes of the generated tokens
// (stop token included), so a later rendering matches it only where the session really holds that text.
//
// Not thread-safe; owns its messages and template.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/base/expected.h"
#include "core/chat/chat_template.h"

namespace kestrel::cli {

class ChatConversation {
 public:
  // `globals`: what the template sees besides messages and add_generation_prompt (bos_token, eos_token,
  // enable_thinking). A non-empty `system` is the first message.
  ChatConversation(chat::ChatTemplate tmpl, nlohmann::ordered_json globals, std::string system);

  struct Turn {
    std::string text;  // what to send to the session
    bool reset;        // the session must be reset first (text is the whole rendering)
  };
  // Adds a user message and renders. On a render error (the template refuses the conversation) the message is not
  // kept and the error is returned.
  Expected<Turn> user_turn(std::string content);
  // Records the answer to the last turn: `content` the generated text (valid UTF-8, no stop token), `generated` the
  // exact bytes of every generated token (the stop token's text included when the answer ended with one).
  void answer(std::string content, std::string_view generated);
  // Forgets the conversation (the caller resets the session); the system message stays.
  void reset();

  const nlohmann::ordered_json& messages() const { return messages_; }

 private:
  chat::ChatTemplate tmpl_;
  nlohmann::ordered_json globals_;
  std::string system_;
  nlohmann::ordered_json messages_;
  std::string held_;  // the text the session holds
};

}  // namespace kestrel::cli
