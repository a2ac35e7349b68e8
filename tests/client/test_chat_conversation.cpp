// `kestrel chat`'s conversation logic without a daemon: what each turn sends to the session, when the session must
// be reset, and what a template's refusal leaves behind. The expected prompts are renderings of the same template
// by core/chat (itself checked against jinja2 in tests/golden), so these tests check the prefix bookkeeping.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "client/cli/chat_conversation.h"

namespace kestrel::cli {
namespace {

using Json = nlohmann::ordered_json;

chat::ChatTemplate load(const std::string& name) {
  std::ifstream in(std::string(KESTREL_TEST_DATA_DIR) + "/chat_templates/" + name + ".jinja", std::ios::binary);
  std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto t = chat::ChatTemplate::parse(source);
  EXPECT_TRUE(t) << name << ": " << t.error().to_string();
  return std::move(*t);
}

std::string render(const std::string& name, const Json& messages, const Json& globals = Json::object()) {
  Json ctx = globals;
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = true;
  auto r = load(name).render(ctx);
  EXPECT_TRUE(r) << r.error().to_string();
  return r ? *r : std::string();
}

TEST(ChatConversation, SendsOnlyWhatTheSessionLacks) {
  ChatConversation conv(load("qwen3-next-instruct"), Json::object(), "Be brief.");
  auto t1 = conv.user_turn("Hi");
  ASSERT_TRUE(t1) << t1.error().to_string();
  EXPECT_FALSE(t1->reset);
  const Json m1 = Json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(t1->text, render("qwen3-next-instruct", m1));

  conv.answer("Hello!", "Hello!<|im_end|>");
  auto t2 = conv.user_turn("Bye");
  ASSERT_TRUE(t2);
  EXPECT_FALSE(t2->reset);
  EXPECT_EQ(t2->text, "\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  Json m2 = m1;
  m2.push_back({{"role", "assistant"}, {"content", "Hello!"}});
  m2.push_back({{"role", "user"}, {"content", "Bye"}});
  EXPECT_EQ(conv.messages(), m2);
  EXPECT_EQ(t1->text + "Hello!<|im_end|>" + t2->text, render("qwen3-next-instruct", m2));
}

TEST(ChatConversation, ResetsWhenTheTemplateRewritesHistory) {
  // Qwen3 drops the reasoning of answers before the last user message: the session's <think> block is not part of
  // the next rendering, so the session is reset and the whole rendering sent.
  ChatConversation conv(load("qwen3"), Json::object(), "");
  ASSERT_TRUE(conv.user_turn("2+2?"));
  const std::string answer = "<think>\nadd\n</think>\n\n4";
  conv.answer(answer, answer + "<|im_end|>");
  auto t2 = conv.user_turn("3+3?");
  ASSERT_TRUE(t2);
  EXPECT_TRUE(t2->reset);
  EXPECT_EQ(t2->text, render("qwen3", conv.messages()));
  EXPECT_EQ(t2->text.find("<think>"), std::string::npos);
  // After the reset the session holds that rendering, and a plain answer extends it again.
  conv.answer("6", "6<|im_end|>");
  auto t3 = conv.user_turn("thanks");
  ASSERT_TRUE(t3);
  EXPECT_FALSE(t3->reset);
}

TEST(ChatConversation, AnswerBytesThatDifferFromItsTextForceAReset) {
  // An answer whose tokens are not valid UTF-8: the content holds U+FFFD, the session the raw bytes.
  ChatConversation conv(load("qwen3-next-instruct"), Json::object(), "");
  ASSERT_TRUE(conv.user_turn("Hi"));
  conv.answer("a\xEF\xBF\xBD", std::string("a\xC3") + "<|im_end|>");
  auto t2 = conv.user_turn("Hi");
  ASSERT_TRUE(t2);
  EXPECT_TRUE(t2->reset);
}

TEST(ChatConversation, ThinkingSwitchAndRefusals) {
  ChatConversation off(load("qwen3"), Json{{"enable_thinking", false}}, "");
  auto t = off.user_turn("Hi");
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << t->text;

  // A conversation the template refuses (its raise_exception): the error comes back and the message is not kept.
  auto strict = chat::ChatTemplate::parse(
      "{% for m in messages %}{% if m.content == 'forbidden' %}{{ raise_exception('forbidden word') }}{% endif %}"
      "<{{ m.role }}>{{ m.content }}{% endfor %}");
  ASSERT_TRUE(strict);
  ChatConversation conv(std::move(*strict), Json::object(), "");
  auto ok = conv.user_turn("fine");
  ASSERT_TRUE(ok) << ok.error().to_string();
  EXPECT_EQ(ok->text, "<user>fine");
  conv.answer("ans", "<assistant>ans");
  const Json before = conv.messages();
  auto bad = conv.user_turn("forbidden");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("forbidden word"), std::string::npos) << bad.error().message;
  EXPECT_EQ(conv.messages(), before);
  auto again = conv.user_turn("again");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->reset);
  EXPECT_EQ(again->text, "<user>again");
  // Text that is not UTF-8 cannot be rendered either.
  EXPECT_FALSE(conv.user_turn(std::string("bad \xFF byte")));
  EXPECT_EQ(conv.messages().size(), 3u);
}

TEST(ChatConversation, ResetKeepsTheSystemMessage) {
  ChatConversation conv(load("qwen3-next-thinking"), Json::object(), "sys");
  ASSERT_TRUE(conv.user_turn("one"));
  conv.answer("x", "x<|im_end|>");
  conv.reset();
  EXPECT_EQ(conv.messages(), Json::array({{{"role", "system"}, {"content", "sys"}}}));
  auto t = conv.user_turn("two");
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->reset);
  EXPECT_TRUE(t->text.starts_with("<|im_start|>system\nsys<|im_end|>\n")) << t->text;
  EXPECT_TRUE(t->text.ends_with("<|im_start|>assistant\n<think>\n")) << t->text;
}

}  // namespace
}  // namespace kestrel::cli
