// The OpenAI request bodies (daemon/http/openai_request.h, chat_context.h): every accepted field lands where it
// belongs, and every refusal (bad JSON, wrong types, out-of-range values, unknown fields, features kestreld does not
// implement) is an ApiError that names the field.
#include <gtest/gtest.h>

#include <string>

#include "daemon/http/chat_context.h"
#include "daemon/http/openai_request.h"

namespace kestrel::daemon::http {
namespace {

Json body(const std::string& text) {
  Json j;
  const FieldError e = parse_body(text, &j);
  EXPECT_FALSE(e) << text << " -> " << (e ? e->message : "");
  return j;
}

CompletionRequest completion_ok(const std::string& text) {
  CompletionRequest r;
  const FieldError e = parse_completion_request(body(text), RequestLimits{}, &r);
  EXPECT_FALSE(e) << text << " -> " << (e ? e->message : "");
  return r;
}

CompletionRequest chat_ok(const std::string& text) {
  CompletionRequest r;
  const FieldError e = parse_chat_request(body(text), RequestLimits{}, &r);
  EXPECT_FALSE(e) << text << " -> " << (e ? e->message : "");
  return r;
}

// The refusal of a body, which must name `param` and contain `words`.
ApiError refused(bool chat, const std::string& text, const std::string& param, const std::string& words) {
  CompletionRequest r;
  const FieldError e = chat ? parse_chat_request(body(text), RequestLimits{}, &r)
                            : parse_completion_request(body(text), RequestLimits{}, &r);
  EXPECT_TRUE(e.has_value()) << text << " was accepted";
  if (!e) return ApiError{};
  EXPECT_EQ(e->status, 400) << text;
  EXPECT_EQ(e->param, param) << text << " -> " << e->message;
  EXPECT_NE(e->message.find(words), std::string::npos) << text << " -> " << e->message;
  return *e;
}

constexpr const char* kUser = R"("messages": [{"role": "user", "content": "hi"}])";

TEST(OpenAiRequest, BadJsonAndNonObjectsAreRefusedWithWhere) {
  Json j;
  FieldError e = parse_body("{\"prompt\": \"x\",", &j);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "invalid_json");
  EXPECT_NE(e->message.find("not valid JSON"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("column"), std::string::npos) << e->message;
  e = parse_body("[1, 2]", &j);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("must be a JSON object, got an array"), std::string::npos) << e->message;
  EXPECT_TRUE(parse_body("", &j).has_value());
}

TEST(OpenAiRequest, CompletionFieldsLandInTheRequest) {
  const CompletionRequest r = completion_ok(R"({"model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5,
      "top_p": 0.9, "top_k": 12, "min_p": 0.1, "seed": 42, "stop": ["\n", "END"], "presence_penalty": 0.5,
      "frequency_penalty": -0.25, "repetition_penalty": 1.1, "n": 1, "stream": true,
      "stream_options": {"include_usage": true}, "user": "u1", "logit_bias": {}, "logprobs": 3, "echo": false,
      "best_of": 1, "suffix": null, "ignore_eos": true})");
  EXPECT_EQ(r.kind, ApiKind::kCompletion);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "Hello");
  EXPECT_TRUE(r.prompt_tokens.empty());
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
  EXPECT_EQ(*r.sampling.top_k, 12);
  EXPECT_FLOAT_EQ(*r.sampling.min_p, 0.1f);
  EXPECT_EQ(*r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_FLOAT_EQ(*r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.frequency_penalty, -0.25f);
  EXPECT_FLOAT_EQ(*r.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_FALSE(r.sampling.penalty_last_n.has_value());
}

TEST(OpenAiRequest, PromptForms) {
  EXPECT_EQ(completion_ok(R"({"prompt": [1, 2, 3]})").prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(completion_ok(R"({"prompt": [[5, 6]]})").prompt_tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(completion_ok(R"({"prompt": ["one"]})").prompt_text, "one");
  refused(false, R"({"prompt": ["a", "b"]})", "prompt", "one prompt per request");
  refused(false, R"({"prompt": [[1], [2]]})", "prompt", "one prompt per request");
  refused(false, R"({"prompt": ""})", "prompt", "empty");
  refused(false, R"({"prompt": []})", "prompt", "empty");
  refused(false, R"({"prompt": [1, -2]})", "prompt[1]", "integer from 0");
  refused(false, R"({"prompt": [1, "x"]})", "prompt[1]", "integer");
  refused(false, R"({"prompt": 5})", "prompt", "must be a string");
  refused(false, R"({"max_tokens": 5})", "prompt", "required");
}

TEST(OpenAiRequest, NullMeansNotGivenAndTopKMinusOneIsOff) {
  const CompletionRequest r = completion_ok(R"({"prompt": "x", "temperature": null, "top_k": -1, "stop": "s"})");
  EXPECT_FALSE(r.sampling.temperature.has_value());
  EXPECT_EQ(*r.sampling.top_k, 0);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"s"}));
  EXPECT_EQ(completion_ok(R"({"prompt": "x", "seed": -1})").sampling.seed, ~uint64_t{0});
}

TEST(OpenAiRequest, WrongTypesAndRangesNameTheField) {
  refused(false, R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens", "\"ten\" (a string)");
  refused(false, R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "from 1");
  refused(false, R"({"prompt": "x", "max_tokens": 2.5})", "max_tokens", "integer");
  refused(false, R"({"prompt": "x", "temperature": -1})", "temperature", ">= 0");
  refused(false, R"({"prompt": "x", "temperature": "hot"})", "temperature", "must be a number");
  refused(false, R"({"prompt": "x", "top_p": 0})", "top_p", "greater than 0");
  refused(false, R"({"prompt": "x", "top_p": 1.5})", "top_p", "from 0 to 1");
  refused(false, R"({"prompt": "x", "min_p": 2})", "min_p", "from 0 to 1");
  refused(false, R"({"prompt": "x", "top_k": -2})", "top_k", "from -1");
  refused(false, R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty", "greater than 0");
  refused(false, R"({"prompt": "x", "stream": "yes"})", "stream", "true or false");
  refused(false, R"({"prompt": "x", "stop": [""]})", "stop[0]", "empty");
  refused(false, R"({"prompt": "x", "stop": 3})", "stop", "string or an array");
  refused(false, R"({"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
          "stop", "at most 16");
  refused(false, R"({"prompt": "x", "stop": [")" + std::string(300, 'z') + R"("]})", "stop[0]", "300 bytes");
  refused(false, R"({"prompt": "x", "logprobs": 21})", "logprobs", "from 0 to 20");
  refused(false, R"({"prompt": "x", "stream_options": {"include_usage": 1}})", "stream_options.include_usage",
          "true or false");
  refused(false, R"({"prompt": "x", "user": 5})", "user", "must be a string");
}

TEST(OpenAiRequest, UnknownFieldsAreRefusedNotIgnored) {
  const ApiError e = refused(false, R"({"prompt": "x", "temprature": 0.5})", "temprature", "Unrecognized");
  EXPECT_EQ(e.code, "unknown_parameter");
  EXPECT_NE(e.message.find("temperature"), std::string::npos) << "the message lists what is accepted";
  refused(true, std::string("{") + kUser + R"(, "foo": 1})", "foo", "Unrecognized");
  refused(false, R"({"prompt": "x", "stream_options": {"chunk_size": 3}})", "stream_options.chunk_size",
          "Unrecognized");
  refused(true, std::string("{") + kUser + R"(, "messages": [{"role": "user", "content": "x", "mood": "ok"}]})",
          "messages[0].mood", "Unrecognized");
}

TEST(OpenAiRequest, UnsupportedFeaturesAreRefusedWithTheReason) {
  const std::string u = std::string("{") + kUser;
  ApiError e = refused(true, u + R"(, "n": 2})", "n", "one choice per request");
  EXPECT_EQ(e.code, "unsupported_parameter");
  refused(false, R"({"prompt": "x", "n": 3})", "n", "send 3 requests");
  refused(false, R"({"prompt": "x", "best_of": 2})", "best_of", "not supported");
  refused(false, R"({"prompt": "x", "suffix": "end"})", "suffix", "not supported");
  refused(false, R"({"prompt": "x", "logit_bias": {"5": 10}})", "logit_bias", "not supported");
  refused(false, R"({"prompt": "x", "echo": true, "logprobs": 1})", "echo", "prompt tokens");
  refused(true, u + R"(, "tools": [{"type": "function", "function": {"name": "f"}}]})", "tools", "cannot honour");
  refused(true, u + R"(, "tool_choice": "required"})", "tool_choice", "not supported");
  refused(true, u + R"(, "response_format": {"type": "json_object"}})", "response_format", "constrained decoding");
  refused(true, u + R"(, "functions": [{"name": "f"}]})", "functions", "not supported");
  refused(true, u + R"(, "audio": {"voice": "x"}})", "audio", "not supported");
  refused(true, u + R"(, "reasoning_effort": "low"})", "reasoning_effort", "enable_thinking");
  refused(true, u + R"(, "store": true})", "store", "not supported");
  refused(true, u + R"(, "chat_template_kwargs": {"custom": 1}})", "chat_template_kwargs.custom", "not supported");
}

TEST(OpenAiRequest, HarmlessFieldsAreAccepted) {
  const CompletionRequest r =
      chat_ok(std::string("{") + kUser +
              R"(, "tools": [], "tool_choice": "none", "parallel_tool_calls": false, "response_format": {"type":
              "text"}, "store": false, "logit_bias": {}, "user": "x", "stream_options": {"include_usage": true}})");
  EXPECT_FALSE(r.stream);
}

TEST(OpenAiRequest, ChatFields) {
  const CompletionRequest r = chat_ok(std::string("{") + kUser +
                                      R"(, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 4,
      "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(r.kind, ApiKind::kChat);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_EQ(r.chat_context["enable_thinking"], false);
  EXPECT_EQ(r.chat_context["add_generation_prompt"], true);
  EXPECT_EQ(r.chat_context["messages"], Json::parse(R"([{"role": "user", "content": "hi"}])"));
  EXPECT_FALSE(r.chat_context.contains("tools"));

  EXPECT_EQ(chat_ok(std::string("{") + kUser + R"(, "max_tokens": 5, "max_completion_tokens": 5})").max_tokens, 5);
  refused(true, std::string("{") + kUser + R"(, "max_tokens": 5, "max_completion_tokens": 6})", "max_completion_tokens",
          "disagree");
  refused(true, std::string("{") + kUser + R"(, "top_logprobs": 2})", "top_logprobs", "logprobs: true");
  refused(true, std::string("{") + kUser + R"(, "logprobs": 1})", "logprobs", "true or false");
  refused(true, R"({"model": "m"})", "messages", "required");
  refused(true, R"({"messages": []})", "messages", "empty");
  refused(true, R"({"messages": "hi"})", "messages", "array of messages");
}

TEST(ChatContext, MessagesBecomeTheTemplateContext) {
  Json out;
  const Json messages = Json::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}], "name": "ann"},
    {"role": "assistant", "content": null, "reasoning_content": "think",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Oslo\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "raw", "arguments": "not json"}}]},
    {"role": "tool", "content": "12 C", "tool_call_id": "c1"}
  ])");
  const FieldError e = read_chat_messages(messages, 100, &out);
  ASSERT_FALSE(e) << e->message;
  const Json want = Json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "first\nsecond", "name": "ann"},
    {"role": "assistant", "content": "", "reasoning_content": "think",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"city": "Oslo"}}},
                    {"id": "c2", "type": "function", "function": {"name": "raw", "arguments": "not json"}}]},
    {"role": "tool", "content": "12 C", "tool_call_id": "c1"}
  ])");
  EXPECT_EQ(out, want) << out.dump(2);

  const Json ctx = template_context(Json{{"messages", out}, {"add_generation_prompt", true}}, "", "<|im_end|>");
  EXPECT_EQ(ctx["bos_token"], "");
  EXPECT_EQ(ctx["eos_token"], "<|im_end|>");
  EXPECT_EQ(ctx["messages"], want);
}

TEST(ChatContext, BadMessagesNameTheirPlace) {
  auto bad = [](const std::string& text, const std::string& param, const std::string& words) {
    Json out;
    const FieldError e = read_chat_messages(Json::parse(text), 3, &out);
    ASSERT_TRUE(e) << text;
    EXPECT_EQ(e->param, param) << e->message;
    EXPECT_NE(e->message.find(words), std::string::npos) << e->message;
  };
  bad(R"([{"content": "x"}])", "messages[0].role", "no role");
  bad(R"([{"role": "wizard", "content": "x"}])", "messages[0].role", "system, developer, user");
  bad(R"([{"role": "user"}])", "messages[0].content", "no content");
  bad(R"([{"role": "user", "content": null}])", "messages[0].content", "needs content");
  bad(R"([{"role": "user", "content": 4}])", "messages[0].content", "string or an array");
  bad(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])",
      "messages[0].content[0].type", "text only");
  bad(R"([{"role": "user", "content": "a", "tool_calls": []}])", "messages[0].tool_calls", "Unrecognized");
  bad(R"([{"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {"arguments": "{}"}}]}])",
      "messages[0].tool_calls[0].function.name", "no name");
  bad(R"(["hello"])", "messages[0]", "must be an object");
  bad(R"([{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"},
          {"role":"user","content":"d"}])",
      "messages", "at most 3");
}

}  // namespace
}  // namespace kestrel::daemon::http
