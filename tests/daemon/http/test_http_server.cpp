// HttpServer on 127.0.0.1 (a free port) in front of a fake Service, driven by a plain Boost.Beast client: routes,
// methods, the API key, body and concurrency limits, keep-alive, 100-continue, completions whole and streamed (SSE
// with chunked encoding, usage, [DONE]), the loading state, a client that disconnects mid-stream (the generation is
// cancelled), and the metrics page counting what happened.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/http/http_server.h"
#include "daemon/http/json_fields.h"
#include "tests/daemon/server/fake_service.h"

namespace kestrel::daemon::http {
namespace {

namespace beast = boost::beast;
namespace net = boost::asio;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using testing::FakeService;

struct Reply {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string connection;
  std::string allow;
};

// One connection to the server; request() sends one request and reads its whole answer (chunked decoded).
class Client {
 public:
  explicit Client(int port) : stream_(ioc_) {
    stream_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  }

  Reply request(bhttp::verb method, const std::string& target, const std::string& body = "",
                const std::string& key = "") {
    bhttp::request<bhttp::string_body> req{method, target, 11};
    req.set(bhttp::field::host, "127.0.0.1");
    if (!body.empty()) req.set(bhttp::field::content_type, "application/json");
    if (!key.empty()) req.set(bhttp::field::authorization, "Bearer " + key);
    req.body() = body;
    req.prepare_payload();
    bhttp::write(stream_, req);
    return read();
  }

  Reply read() {
    bhttp::response<bhttp::string_body> res;
    beast::error_code ec;
    bhttp::read(stream_, buffer_, res, ec);
    if (ec) return Reply{-1, ec.message(), "", "", ""};
    return Reply{static_cast<int>(res.result_int()), res.body(), std::string(res[bhttp::field::content_type]),
                 std::string(res[bhttp::field::connection]), std::string(res[bhttp::field::allow])};
  }

  beast::tcp_stream& stream() { return stream_; }

 private:
  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void start(HttpServerOptions o = {}, bool attach = true) {
    o.address = "127.0.0.1:0";
    auto s = HttpServer::start(o);
    ASSERT_TRUE(s) << s.error().to_string();
    server_ = std::move(*s);
    if (attach) server_->attach(service_, ServedModel{"tiny-model", 1700000000, "", "", "<|im_end|>"});
  }
  Client client() { return Client(server_->port()); }

  FakeService service_;
  std::unique_ptr<HttpServer> server_;
};

Json json_of(const Reply& r) {
  Json j = Json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  return j;
}

void expect_error(const Reply& r, int status, const std::string& words) {
  EXPECT_EQ(r.status, status) << r.body;
  const Json j = json_of(r);
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(words), std::string::npos) << r.body;
  EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") && j["error"].contains("code")) << r.body;
}

// The JSON payloads of a stream's events, "[DONE]" as the string "[DONE]".
std::vector<Json> events(const std::string& body) {
  std::vector<Json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event: " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string line = body.substr(pos, end - pos);
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    const std::string data = line.substr(6);
    out.push_back(data == "[DONE]" ? Json("[DONE]") : Json::parse(data));
    pos = end + 2;
  }
  return out;
}

TEST_F(HttpServerTest, HealthModelsAndRoutes) {
  start();
  Client c = client();
  Reply r = c.request(bhttp::verb::get, "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json_of(r), Json::parse(R"({"status": "ok"})"));
  r = c.request(bhttp::verb::get, "/v1/models");  // the same connection: keep-alive
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json_of(r)["data"][0]["id"], "tiny-model");
  r = c.request(bhttp::verb::get, "/v1/models/tiny-model?x=1");
  EXPECT_EQ(json_of(r)["id"], "tiny-model");
  expect_error(c.request(bhttp::verb::get, "/v1/models/gpt-4"), 404, "does not exist");
  expect_error(c.request(bhttp::verb::get, "/v1/nothing"), 404, "no route");
  r = c.request(bhttp::verb::get, "/v1/completions");
  expect_error(r, 405, "not allowed");
  EXPECT_EQ(r.allow, "POST");
  expect_error(c.request(bhttp::verb::post, "/health", "{}"), 405, "not allowed");
  r = c.request(bhttp::verb::get, "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(r.body.find("kestrel:num_requests_running{transport=\"http\"} 0"), std::string::npos) << r.body;
}

TEST_F(HttpServerTest, LoadingAndDraining) {
  start({}, /*attach=*/false);
  Client c = client();
  Reply r = c.request(bhttp::verb::get, "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json_of(r)["status"], "loading");
  expect_error(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x"})"), 503, "loading");
  EXPECT_EQ(c.request(bhttp::verb::get, "/metrics").status, 200);
  server_->attach(service_, ServedModel{"m", 1, "", "", ""});
  EXPECT_EQ(c.request(bhttp::verb::get, "/health").status, 200);
  service_.serving = false;
  r = c.request(bhttp::verb::get, "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json_of(r)["status"], "draining");
}

TEST_F(HttpServerTest, ApiKeyGuardsV1Only) {
  HttpServerOptions o;
  o.api_key = "s3cret";
  start(o);
  Client c = client();
  expect_error(c.request(bhttp::verb::get, "/v1/models"), 401, "didn't provide an API key");
  expect_error(c.request(bhttp::verb::get, "/v1/models", "", "wrong"), 401, "Incorrect API key");
  EXPECT_EQ(c.request(bhttp::verb::get, "/v1/models", "", "s3cret").status, 200);
  EXPECT_EQ(c.request(bhttp::verb::get, "/health").status, 200);
  EXPECT_EQ(c.request(bhttp::verb::get, "/metrics").status, 200);
}

TEST_F(HttpServerTest, CompletionWhole) {
  start();
  Client c = client();
  const Reply r = c.request(bhttp::verb::post, "/v1/completions",
                            R"({"model": "tiny-model", "prompt": "abc", "max_tokens": 4, "temperature": 0.5,
                                "seed": 9, "stop": ["zz"], "logprobs": 1})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = json_of(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny-model");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], "abcd");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 4u);
  EXPECT_EQ(j["usage"], Json::parse(R"({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})"));
  // What reached the Service: the fake tokenizes a byte per token; overrides and limits as asked.
  ASSERT_TRUE(service_.last_generate.has_value());
  const GenerateRequest& g = *service_.last_generate;
  EXPECT_EQ(g.prompt, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(g.max_tokens, 4);
  EXPECT_EQ(g.session, 0u);
  EXPECT_EQ(g.transport, Transport::kHttp);
  EXPECT_FLOAT_EQ(*g.sampling.temperature, 0.5f);
  EXPECT_EQ(*g.sampling.seed, 9u);
  EXPECT_EQ(g.stop_strings, (std::vector<std::string>{"zz"}));
  EXPECT_EQ(g.top_logprobs, 1);
  EXPECT_EQ(g.n_ctx, 4096) << "at least default_n_ctx";
}

TEST_F(HttpServerTest, CompletionStreamedWithUsage) {
  start();
  Client c = client();
  const Reply r = c.request(bhttp::verb::post, "/v1/completions",
                            R"({"prompt": "hi", "max_tokens": 3, "stream": true, "echo": true,
                                "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "text/event-stream");
  const std::vector<Json> ev = events(r.body);
  ASSERT_EQ(ev.size(), 7u) << r.body;  // echo, 3 tokens, finish, usage, [DONE]
  EXPECT_EQ(ev[0]["choices"][0]["text"], "hi");
  std::string text;
  for (size_t i = 1; i <= 3; ++i) text += ev[i]["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, "abc");
  EXPECT_EQ(ev[4]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev[5]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ev[5]["choices"], Json::array());
  EXPECT_EQ(ev[6], "[DONE]");
  // The connection stays usable after a stream.
  EXPECT_EQ(c.request(bhttp::verb::get, "/health").status, 200);
}

TEST_F(HttpServerTest, RefusalsAreOpenAiErrors) {
  start();
  Client c = client();
  expect_error(c.request(bhttp::verb::post, "/v1/completions", "{\"prompt\": "), 400, "not valid JSON");
  expect_error(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "n": 2})"), 400, "one choice");
  expect_error(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "model": "gpt-4"})"), 404,
               "does not exist");
  expect_error(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "wat": 1})"), 400, "Unrecognized");
  service_.fail_next(make_error(ErrorCode::kResourceExhausted, "all 2 sessions are in use (max_sessions)"));
  expect_error(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x"})"), 429, "max_sessions");
  // A prompt that leaves no room in the largest context.
  expect_error(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": ")" + std::string(40000, 'x') + R"("})"),
               400, "largest context");
  EXPECT_EQ(c.request(bhttp::verb::get, "/health").status, 200) << "the connection survives every refusal";
}

TEST_F(HttpServerTest, BodyLimitAnswers413AndCloses) {
  HttpServerOptions o;
  o.max_body_bytes = 2048;
  start(o);
  Client c = client();
  const std::string body = R"({"prompt": ")" + std::string(5000, 'x') + "\"}";
  const Reply r = c.request(bhttp::verb::post, "/v1/completions", body);
  // Refused from its Content-Length, as the header ends (under assertions, asking the parser for the length there
  // once stopped kestreld).
  expect_error(r, 413, "the request body is " + std::to_string(body.size()) + " bytes; kestreld accepts at most 2048");
  EXPECT_EQ(r.connection, "close");
  Client again = client();
  EXPECT_EQ(again.request(bhttp::verb::get, "/health").status, 200);
}

// Responses are bounded before they are built: an echoed prompt too large to answer is refused before generating
// (as token ids, from their piece lengths; as text, from its JSON size); a response that is not streamed is refused
// as it passes the limit, and its generation cancelled; the same request streamed is answered in full.
TEST_F(HttpServerTest, ResponsesOverTheLimitAreRefusedBeforeTheyAreBuilt) {
  HttpServerOptions o;
  o.max_response_bytes = 1024;
  start(o);
  Client c = client();
  std::string ids = "[65";
  for (int i = 1; i < 3000; ++i) ids += ",65";
  ids += "]";
  Reply r =
      c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": )" + ids + R"(, "echo": true, "max_tokens": 1})");
  expect_error(r, 400, "the echoed prompt");
  EXPECT_EQ(json_of(r)["error"]["code"], "response_too_large") << r.body;
  EXPECT_EQ(json_of(r)["error"]["param"], "echo") << r.body;
  EXPECT_EQ(service_.last_detokenize_max_bytes.load(), 1024u) << "the Service sized the text before building it";
  // 200 control characters are 200 bytes of prompt but 1200 of JSON (\u0001 each).
  std::string controls;
  for (int i = 0; i < 200; ++i) controls += "\\u0001";
  r = c.request(bhttp::verb::post, "/v1/completions",
                R"({"prompt": ")" + controls + R"(", "echo": true, "max_tokens": 1})");
  expect_error(r, 400, "the echoed prompt is 200 bytes");
  EXPECT_FALSE(service_.last_generate.has_value()) << "nothing was generated for a refused echo";
  // The same prompt without echo, and a short echo, are answered.
  r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": )" + ids + R"(, "max_tokens": 1})");
  EXPECT_EQ(r.status, 200) << r.body;
  r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": [65, 66], "echo": true, "max_tokens": 3})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json_of(r)["choices"][0]["text"], "ABabc");

  // 3000 tokens of one byte each do not fit in 1024 bytes: refused, the generation cancelled part-way.
  service_.token_delay = std::chrono::milliseconds(1);
  const int emitted_before = service_.generate_tokens_emitted.load();
  r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 3000})");
  expect_error(r, 400, "stream it");
  EXPECT_EQ(json_of(r)["error"]["code"], "response_too_large") << r.body;
  EXPECT_EQ(json_of(r)["error"]["param"], "max_tokens") << r.body;
  service_.wait_idle();
  EXPECT_TRUE(service_.generate_saw_cancel.load());
  EXPECT_LT(service_.generate_tokens_emitted.load() - emitted_before, 3000);
  // With log-probabilities the limit comes sooner: 100 tokens are refused.
  service_.generate_saw_cancel = false;
  r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 100, "logprobs": 5})");
  expect_error(r, 400, "alternatives (top_logprobs)");
  service_.wait_idle();
  EXPECT_TRUE(service_.generate_saw_cancel.load());
  service_.token_delay = std::chrono::milliseconds(0);
  // Under the limit: answered whole, within it.
  r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 300})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_LE(r.body.size(), 1024u);
  // Streamed, all 3000 tokens arrive.
  r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 3000, "stream": true})");
  EXPECT_EQ(r.status, 200) << r.body;
  std::string text;
  for (const Json& e : events(r.body)) {
    if (e.is_object() && e.contains("choices") && !e["choices"].empty()) text += e["choices"][0]["text"];
  }
  EXPECT_EQ(text.size(), 3000u);
}

// A generation the daemon's drain deadline ended (FinishReason::kShutdown) is an error that carries the Service's
// message: a 503 whole, an error event and [DONE] streamed.
TEST_F(HttpServerTest, ShutdownEndsACompletionWithItsMessage) {
  start();
  service_.finish_reason = FinishReason::kShutdown;
  service_.finish_message = "kestreld is shutting down: its drain time of 2 s ran out before this generation ended";
  Client c = client();
  Reply r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 3})");
  expect_error(r, 503, "cut short after 3 tokens: kestreld is shutting down: its drain time of 2 s ran out");
  r = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 2, "stream": true})");
  EXPECT_EQ(r.status, 200) << r.body;
  const std::vector<Json> ev = events(r.body);
  ASSERT_GE(ev.size(), 2u) << r.body;
  EXPECT_EQ(ev.back(), Json("[DONE]"));
  const Json& error = ev[ev.size() - 2];
  ASSERT_TRUE(error.contains("error")) << r.body;
  EXPECT_NE(error["error"]["message"].get<std::string>().find("drain time of 2 s"), std::string::npos) << r.body;
  service_.finish_reason = FinishReason::kAborted;
  expect_error(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 1})"), 503,
               "the request was aborted");
}

TEST_F(HttpServerTest, ExpectContinue) {
  start();
  Client c = client();
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
  req.set(bhttp::field::host, "x");
  req.set(bhttp::field::expect, "100-continue");
  req.body() = R"({"prompt": "a", "max_tokens": 1})";
  req.prepare_payload();
  bhttp::request_serializer<bhttp::string_body> sr{req};
  bhttp::write_header(c.stream(), sr);
  const Reply interim = c.read();
  EXPECT_EQ(interim.status, 100);
  bhttp::write(c.stream(), sr);
  EXPECT_EQ(c.read().status, 200);
}

TEST_F(HttpServerTest, ConcurrencyLimitAnswers429WhileOthersRun) {
  HttpServerOptions o;
  o.max_concurrent_requests = 1;
  start(o);
  service_.token_delay = std::chrono::milliseconds(20);
  Client busy = client();
  std::thread t([&] {
    const Reply r = busy.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "a", "max_tokens": 20})");
    EXPECT_EQ(r.status, 200) << r.body;
  });
  while (service_.generate_tokens_emitted.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Client other = client();
  expect_error(other.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "b"})"), 429,
               "max_concurrent_requests");
  EXPECT_EQ(other.request(bhttp::verb::get, "/v1/models").status, 200);
  t.join();
  EXPECT_EQ(other.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "b", "max_tokens": 1})").status, 200);
}

TEST_F(HttpServerTest, ClientThatDisconnectsCancelsItsGeneration) {
  start();
  service_.token_delay = std::chrono::milliseconds(10);
  {
    Client c = client();
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
    req.set(bhttp::field::host, "x");
    req.body() = R"({"prompt": "a", "max_tokens": 100000, "stream": true})";
    req.prepare_payload();
    bhttp::write(c.stream(), req);
    while (service_.generate_tokens_emitted.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }  // the client closes its socket mid-stream
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!service_.generate_saw_cancel.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(service_.generate_saw_cancel.load());
  EXPECT_LT(service_.generate_tokens_emitted.load(), 10000);
  Client after = client();
  EXPECT_EQ(after.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "b", "max_tokens": 2})").status, 200)
      << "its concurrency slot was given back";
}

// The conversation reaches the Service rendered by the model's chat template (the fake tokenizes a byte per token).
TEST_F(HttpServerTest, ChatCompletionRendersTheTemplate) {
  HttpServerOptions o;
  o.address = "127.0.0.1:0";
  auto s = HttpServer::start(o);
  ASSERT_TRUE(s) << s.error().to_string();
  server_ = std::move(*s);
  server_->attach(service_, ServedModel{"chat-model", 1, R"({%- for m in messages -%}
[{{ m.role }}]{{ m.content }}
{%- endfor -%}
{%- if add_generation_prompt %}[assistant]{% endif -%}
{%- if messages[0].role != 'system' %}{{ raise_exception('the first message must be a system message') }}{% endif -%})",
                                        "", "<eos>"});
  Client c = client();
  Reply r = c.request(bhttp::verb::post, "/v1/chat/completions",
                      R"({"model": "chat-model", "messages": [{"role": "developer", "content": "Be brief."},
                          {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 3,
                          "logprobs": true, "top_logprobs": 1})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = json_of(r);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "abc");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"].size(), 3u);
  ASSERT_TRUE(service_.last_generate.has_value());
  const std::string rendered = "[system]Be brief.[user]Hi[assistant]";
  EXPECT_EQ(service_.last_generate->prompt, std::vector<int32_t>(rendered.begin(), rendered.end()));

  r = c.request(bhttp::verb::post, "/v1/chat/completions",
                R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
                    "max_tokens": 2, "stream": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<Json> ev = events(r.body);
  ASSERT_EQ(ev.size(), 5u) << r.body;  // role, 2 deltas, finish, [DONE]
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(ev[1]["choices"][0]["delta"]["content"], "a");
  EXPECT_EQ(ev[3]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev[4], "[DONE]");

  expect_error(c.request(bhttp::verb::post, "/v1/chat/completions",
                         R"({"messages": [{"role": "user", "content": "no system message"}]})"),
               400, "first message must be a system message");
}

TEST_F(HttpServerTest, ChatWithoutATemplateIs501) {
  start();
  Client c = client();
  expect_error(
      c.request(bhttp::verb::post, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}]})"), 501,
      "no chat template");
  EXPECT_EQ(c.request(bhttp::verb::post, "/v1/completions", R"({"prompt": "x", "max_tokens": 1})").status, 200);
}

TEST_F(HttpServerTest, MalformedHttpIs400) {
  start();
  Client c = client();
  net::write(c.stream(), net::buffer(std::string("BLAH\x01 / HTTP/1.1\r\n\r\n")));
  const Reply r = c.read();
  EXPECT_EQ(r.status, 400) << r.body;
}

TEST_F(HttpServerTest, StopClosesIdleConnections) {
  start();
  Client c = client();
  EXPECT_EQ(c.request(bhttp::verb::get, "/health").status, 200);
  server_->stop(Clock::now() + std::chrono::seconds(2));
  EXPECT_EQ(c.request(bhttp::verb::get, "/health").status, -1);
}

}  // namespace
}  // namespace kestrel::daemon::http
