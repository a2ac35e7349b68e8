// The OpenAI response JSON and server-sent events (daemon/http/openai_encode.h, api_error.h): the shapes clients
// parse, field by field, for both endpoints, whole and streamed, with usage and log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "daemon/http/api_error.h"
#include "daemon/http/openai_encode.h"

namespace kestrel::daemon::http {
namespace {

// The JSON of one SSE event ("data: {...}\n\n").
Json event_json(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
  EXPECT_GE(event.size(), 8u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n") << event;
  EXPECT_EQ(event.find('\n'), event.size() - 2) << "one line per event: " << event;
  return Json::parse(event.substr(6, event.size() - 8));
}

TEST(OpenAiEncode, ErrorBody) {
  const Json e = Json::parse(error_body(ApiError::unsupported("n", "n = 2 is not supported")));
  EXPECT_EQ(e, Json::parse(R"({"error": {"message": "n = 2 is not supported", "type": "invalid_request_error",
                                        "param": "n", "code": "unsupported_parameter"}})"));
  const Json plain = Json::parse(error_body(ApiError{500, "bug", "server_error", "", ""}));
  EXPECT_TRUE(plain["error"]["param"].is_null());
  EXPECT_TRUE(plain["error"]["code"].is_null());
  // Bytes that are not UTF-8 in a message become U+FFFD instead of breaking the JSON.
  EXPECT_TRUE(Json::accept(error_body(ApiError::invalid("x", "bad \xff byte"))));
}

TEST(OpenAiEncode, ServiceErrorsMapToHttpStatuses) {
  EXPECT_EQ(ApiError::from_error(make_error(ErrorCode::kInvalidArgument, "x")).status, 400);
  EXPECT_EQ(ApiError::from_error(make_error(ErrorCode::kOutOfRange, "x")).code, "context_length_exceeded");
  EXPECT_EQ(ApiError::from_error(make_error(ErrorCode::kResourceExhausted, "x")).status, 429);
  EXPECT_EQ(ApiError::from_error(make_error(ErrorCode::kUnavailable, "x")).status, 503);
  EXPECT_EQ(ApiError::from_error(make_error(ErrorCode::kDeadlineExceeded, "x")).status, 504);
  EXPECT_EQ(ApiError::from_error(make_error(ErrorCode::kInternal, "x")).status, 500);
  EXPECT_EQ(ApiError::from_error(make_error(ErrorCode::kNotFound, "x")).status, 404);
}

TEST(OpenAiEncode, FinishReasons) {
  EXPECT_EQ(finish_reason_text(FinishReason::kStopToken), "stop");
  EXPECT_EQ(finish_reason_text(FinishReason::kStopString), "stop");
  EXPECT_EQ(finish_reason_text(FinishReason::kMaxTokens), "length");
  EXPECT_EQ(finish_reason_text(FinishReason::kContextFull), "length");
  EXPECT_EQ(finish_reason_text(FinishReason::kAborted), "");
}

TEST(OpenAiEncode, ChatCompletionWhole) {
  ResponseEncoder enc(ApiKind::kChat, "chatcmpl-1", 1700000000, "tiny", false, false);
  const Json j = Json::parse(enc.body("Hello!", {}, "stop", Usage{5, 3}));
  EXPECT_EQ(j, Json::parse(R"({"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000,
      "model": "tiny", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
      "logprobs": null, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})"))
      << j.dump(2);
}

TEST(OpenAiEncode, CompletionWholeWithLogprobs) {
  ResponseEncoder enc(ApiKind::kCompletion, "cmpl-1", 1, "tiny", false, true);
  const std::vector<TokenLogprobs> lp = {
      {"He", -0.5f, {{"He", -0.5f}, {"A", -1.5f}}},
      {"\xC3", -std::numeric_limits<float>::infinity(), {}},  // half a character, an impossible token
      {"llo", -0.25f, {{"llo", -0.25f}}},
  };
  const Json j = Json::parse(enc.body("Hello", lp, "length", Usage{2, 3}));
  EXPECT_EQ(j["object"], "text_completion");
  const Json& c = j["choices"][0];
  EXPECT_EQ(c["text"], "Hello");
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["logprobs"]["tokens"], Json::parse(R"(["He", "\ufffd", "llo"])"));
  EXPECT_EQ(c["logprobs"]["token_logprobs"], Json::parse("[-0.5, -9999.0, -0.25]"));
  EXPECT_EQ(c["logprobs"]["top_logprobs"][0], Json::parse(R"({"He": -0.5, "A": -1.5})"));
  EXPECT_EQ(c["logprobs"]["text_offset"], Json::parse("[0, 2, 3]"));
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
}

TEST(OpenAiEncode, ChatLogprobsCarryBytes) {
  ResponseEncoder enc(ApiKind::kChat, "chatcmpl-2", 1, "tiny", false, true);
  const std::vector<TokenLogprobs> lp = {{"\xC3\xA9", -0.1f, {{"\xC3\xA9", -0.1f}, {"e", -2.0f}}}};
  const Json j = Json::parse(enc.body("\xC3\xA9", lp, "stop", Usage{1, 1}));
  const Json& t = j["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(t["token"], "\xC3\xA9");
  EXPECT_EQ(t["bytes"], Json::parse("[195, 169]"));
  EXPECT_FLOAT_EQ(t["logprob"].get<float>(), -0.1f);
  EXPECT_EQ(t["top_logprobs"].size(), 2u);
  EXPECT_EQ(t["top_logprobs"][1]["token"], "e");
  EXPECT_EQ(t["top_logprobs"][1]["bytes"], Json::parse("[101]"));
}

TEST(OpenAiEncode, ChatStreamEventsInOrder) {
  ResponseEncoder enc(ApiKind::kChat, "chatcmpl-3", 7, "tiny", true, false);
  const Json open = event_json(enc.open_event());
  EXPECT_EQ(open["object"], "chat.completion.chunk");
  EXPECT_EQ(open["choices"][0]["delta"], Json::parse(R"({"role": "assistant", "content": ""})"));
  EXPECT_TRUE(open["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(open.contains("usage") && open["usage"].is_null()) << "include_usage: every chunk has usage null";

  const Json delta = event_json(enc.delta_event("Hel", {}));
  EXPECT_EQ(delta["id"], "chatcmpl-3");
  EXPECT_EQ(delta["created"], 7);
  EXPECT_EQ(delta["choices"][0]["delta"], Json::parse(R"({"content": "Hel"})"));
  EXPECT_TRUE(delta["choices"][0]["logprobs"].is_null());

  const Json fin = event_json(enc.finish_event("length"));
  EXPECT_EQ(fin["choices"][0]["delta"], Json::object());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");

  const Json usage = event_json(enc.usage_event(Usage{4, 2}));
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"], Json::parse(R"({"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6})"));
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(OpenAiEncode, CompletionStreamEvents) {
  ResponseEncoder enc(ApiKind::kCompletion, "cmpl-4", 7, "tiny", false, true);
  EXPECT_EQ(enc.open_event(), "") << "the legacy stream has no role event";
  const std::vector<TokenLogprobs> a = {{"ab", -1.0f, {}}};
  const std::vector<TokenLogprobs> b = {{"c", -2.0f, {}}};
  const Json first = event_json(enc.delta_event("ab", a));
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"][0]["text"], "ab");
  EXPECT_FALSE(first.contains("usage")) << "without include_usage no usage key";
  const Json second = event_json(enc.delta_event("c", b));
  EXPECT_EQ(second["choices"][0]["logprobs"]["text_offset"], Json::parse("[2]")) << "offsets run across events";
  const Json fin = event_json(enc.finish_event("stop"));
  EXPECT_EQ(fin["choices"][0]["text"], "");
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
}

TEST(OpenAiEncode, TextThatIsNotUtf8StaysValidJson) {
  ResponseEncoder enc(ApiKind::kChat, "chatcmpl-5", 1, "tiny", false, false);
  EXPECT_NO_THROW((void)event_json(enc.delta_event("bad \xff", {})));
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
}

TEST(OpenAiEncode, Models) {
  const Json list = Json::parse(models_body("tiny", 42));
  EXPECT_EQ(list, Json::parse(R"({"object": "list", "data": [{"id": "tiny", "object": "model", "created": 42,
      "owned_by": "kestrel"}]})"));
  EXPECT_EQ(Json::parse(model_body("tiny", 42)), list["data"][0]);
}

}  // namespace
}  // namespace kestrel::daemon::http
