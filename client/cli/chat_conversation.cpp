// The conversation of `kestrel chat` and the prompt text to send each turn (chat_conversation.h).
#include "client/cli/chat_conversation.h"

#include <utility>

namespace kestrel::cli {

ChatConversation::ChatConversation(chat::ChatTemplate tmpl, nlohmann::ordered_json globals, std::string system)
    : tmpl_(std::move(tmpl)), globals_(std::move(globals)), system_(std::move(system)) {
  reset();
}

void ChatConversation::reset() {
  messages_ = nlohmann::ordered_json::array();
  if (!system_.empty()) messages_.push_back({{"role", "system"}, {"content", system_}});
  held_.clear();
}

Expected<ChatConversation::Turn> ChatConversation::user_turn(std::string content) {
  messages_.push_back({{"role", "user"}, {"content", std::move(content)}});
  nlohmann::ordered_json ctx = globals_;
  ctx["messages"] = messages_;
  ctx["add_generation_prompt"] = true;
  auto prompt = tmpl_.render(ctx);
  if (!prompt) {
    messages_.erase(messages_.size() - 1);
    return std::move(prompt).error();
  }
  Turn turn;
  turn.reset = !std::string_view(*prompt).starts_with(held_);
  turn.text = turn.reset ? *prompt : prompt->substr(held_.size());
  held_ = std::move(*prompt);
  return turn;
}

void ChatConversation::answer(std::string content, std::string_view generated) {
  held_ += generated;
  messages_.push_back({{"role", "assistant"}, {"content", std::move(content)}});
}

}  // namespace kestrel::cli
