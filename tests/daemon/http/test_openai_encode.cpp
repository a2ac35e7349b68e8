// The OpenAI response JSON and server-sent events (daemon/http/openai_encode.h, api_error.h): the shapes clients
// parse, field by field, for both endpoints, whole and streamed, with usage and log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "daemon/engine/text_stream.h"
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
  // What the client sent is quoted, within a bound: a message and a param cut at a character boundary.
  const std::string long_key = "k" + std::string(3000, 'x');
  const std::string cjk = std::string(1023, 'a') + "\xe6\x97\xa5";
  const Json cut = Json::parse(error_body(ApiError::invalid(long_key, "Unrecognized request argument: " + long_key)));
  const std::string message = cut["error"]["message"];
  EXPECT_EQ(message.size(), 1024u + std::string(" [2008 more bytes]").size()) << message;
  EXPECT_TRUE(message.ends_with("xxx [2008 more bytes]")) << message;
  EXPECT_EQ(cut["error"]["param"].get<std::string>().size(), 256u + std::string(" [2745 more bytes]").size());
  EXPECT_EQ(Json::parse(error_body(ApiError::invalid("x", cjk)))["error"]["message"],
            std::string(1023, 'a') + " [3 more bytes]");
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
  EXPECT_EQ(finish_reason_text(FinishReason::kShutdown), "") << "answered as an error with the Service's message";
}

// Random bytes with what JSON escapes or replaces: quotes, backslashes, control characters, DEL, valid multi-byte
// characters and bytes that are not UTF-8.
std::string awkward_bytes(std::mt19937& rng, size_t max_len) {
  static const std::vector<std::string> kPieces = {"a",
                                                   "\"",
                                                   "\\",
                                                   "\n",
                                                   "\t",
                                                   std::string(1, '\0'),
                                                   "\x01",
                                                   "\x1f",
                                                   "\x7f",
                                                   "\xc3\xa9",
                                                   "\xe6\x97\xa5",
                                                   "\xf0\x9f\x98\x80",
                                                   "\xff",
                                                   "\xc3",
                                                   "\xe6\x97",
                                                   "\x80",
                                                   " ",
                                                   "/"};
  std::string out;
  const size_t n = rng() % (max_len + 1);
  while (out.size() < n) out += kPieces[rng() % kPieces.size()];
  return out;
}

TEST(OpenAiEncode, JsonStringSizeIsExact) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const std::string s = awkward_bytes(rng, 40);
    std::string clean;
    append_utf8_sanitized(s, clean);
    EXPECT_EQ(json_string_size(s), Json(clean).dump().size()) << testing::PrintToString(s);
  }
}

// The bound on a whole response holds for random texts and log-probabilities in both forms (the limit checks rely on
// it) and is not far above the real size (so it does not refuse what fits).
TEST(OpenAiEncode, BodySizeBoundHolds) {
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    const ApiKind kind = i % 2 == 0 ? ApiKind::kChat : ApiKind::kCompletion;
    ResponseEncoder enc(kind, "cmpl-0123456789abcdef01234567", 1700000000, awkward_bytes(rng, 12), false, true);
    std::string text;
    size_t text_bytes = 2;
    std::vector<TokenLogprobs> logprobs;
    size_t logprobs_bytes = 0;
    const int tokens = static_cast<int>(rng() % 40);
    for (int t = 0; t < tokens; ++t) {
      const std::string piece = awkward_bytes(rng, 8);
      text += piece;
      text_bytes += json_string_size(piece) - 2;
      TokenLogprobs lp{piece, -static_cast<float>(rng() % 1000) / 7.0f, {}};
      if (t % 5 == 0) lp.logprob = -std::numeric_limits<float>::infinity();
      for (int k = static_cast<int>(rng() % 21); k > 0; --k) {
        lp.top.emplace_back(awkward_bytes(rng, 8), -std::numeric_limits<float>::min() * static_cast<float>(k));
      }
      logprobs_bytes += logprobs_size_bound(lp);
      logprobs.push_back(std::move(lp));
    }
    const size_t bound = enc.body_size_bound(text_bytes, logprobs_bytes);
    const std::string body = enc.body(text, logprobs, "length", Usage{4294967295u, 4294967295u});
    EXPECT_LE(body.size(), bound) << body;
    EXPECT_LE(bound, 3 * body.size() + 1024) << body;
  }
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
