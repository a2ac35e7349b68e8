// Fuzz target for kestreld's HTTP API (docs/http.md): the bytes a client sends, through Boost.Beast's request parser
// with the limits HttpConnection gives it (daemon/http/http_connection.cpp: 64 KiB of header, a body limit), then each
// request parsed into an HttpRequest as HttpConnection::dispatch does and answered by OpenAiApi::handle: routing, the
// JSON body (parse_body, parse_completion_request, parse_chat_request), the chat template, the completion path
// (CompletionCall) and the response encoder, over a Service that checks what the API promises to have checked.
//
// Input: an HTTP/1.1 byte stream; up to 8 pipelined requests are parsed from it, one after the other, until the
// bytes run out or the parser refuses them (as a connection would then answer 400, 413 or 431 and close).
//
// Invariants, beyond no crash and no ASan/UBSan report:
//   - the parser fails only with an HTTP error (or needs more bytes): never with anything else;
//   - every request is answered exactly once: one Response, or one event stream (start, events, end);
//   - a Response is a known status with a JSON body (the metrics page excepted); an error is OpenAI's
//     {"error": {"message" (non-empty), "type", "param", "code"}};
//   - a stream is "data: <JSON>\n\n" events ending with "data: [DONE]\n\n";
//   - no JSON body or event is over ApiOptions::max_response_bytes (a small 16 KiB here, so the bound is exercised;
//     the metrics page, fixed in size, is not JSON);
//   - what reaches the Service is valid: a non-empty prompt of ids in the vocabulary, max_tokens >= 1, the prompt
//     inside n_ctx <= max_session_ctx, top_logprobs 0..20, stop strings within RequestLimits, sampling that
//     validates, a temporary session;
//   - every completion gives back its place among max_concurrent_requests (one here): after the input, one more
//     completion is admitted.
// Built as fuzz_http (libFuzzer) and fuzz_http_smoke.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/engine/service_metrics.h"
#include "daemon/http/json_fields.h"
#include "daemon/http/openai_api.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace kestrel;
using namespace kestrel::daemon;
using namespace kestrel::daemon::http;
using kestrel::fuzz::fuzz_check;
namespace beast = boost::beast;
namespace bhttp = beast::http;

void check(bool ok, const char* what) { fuzz_check(ok, "fuzz_http", what); }

constexpr int32_t kVocab = 300;
constexpr int32_t kMaxSessionCtx = 256;
constexpr size_t kMaxResponseBytes = 16 << 10;
constexpr size_t kMaxHeaderBytes = 64 * 1024;  // as HttpConnection
constexpr size_t kMaxBodyBytes = 64 * 1024;
constexpr int kMaxRequests = 8;

// A Service that trusts nothing and answers synchronously: a token is a byte (ids 256.. are three-byte pieces, some
// not UTF-8), a generation emits up to max_tokens of them and ends in a way the prompt picks, shutdown included.
class StrictService final : public Service {
 public:
  ModelInfo model_info() const override {
    ModelInfo m;
    m.n_vocab = kVocab;
    m.max_session_ctx = kMaxSessionCtx;
    return m;
  }
  ServiceStats stats() const override {
    ServiceStats s;
    s.serving = true;
    return s;
  }
  ServiceLimits limits() const override {
    ServiceLimits l;
    l.default_n_ctx = 64;
    l.max_session_ctx = kMaxSessionCtx;
    return l;
  }
  const ServiceMetrics& metrics() const override { return metrics_; }

  Expected<std::vector<int32_t>> tokenize(const std::string& text, bool /*parse_special*/) const override {
    std::vector<int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  Expected<std::string> detokenize(const std::vector<int32_t>& tokens, size_t max_bytes) const override {
    size_t bytes = 0;
    for (const int32_t t : tokens) {
      if (t < 0 || t >= kVocab) return make_error(ErrorCode::kInvalidArgument, "token id outside the vocabulary");
      bytes += piece(t).size();
    }
    if (bytes > max_bytes) return make_error(ErrorCode::kResourceExhausted, "over max_bytes");
    std::string s;
    for (const int32_t t : tokens) s += piece(t);
    return s;
  }
  Expected<SessionInfo> create_session(const SessionOptions& /*options*/) override { return unexpected(); }
  Expected<SessionInfo> clone_session(SessionId /*id*/, uint64_t /*owner*/) override { return unexpected(); }
  Expected<SessionInfo> reset_session(SessionId /*id*/) override { return unexpected(); }
  Status close_session(SessionId /*id*/) override { return unexpected(); }
  uint32_t close_owned_by(uint64_t /*owner*/) override { return 0; }
  Expected<bool> abort(SessionId /*id*/) override { return unexpected(); }
  void drain(Clock::time_point /*deadline*/) override {}
  void step(StepRequest /*request*/, std::function<void(Expected<StepResult>)> done) override { done(unexpected()); }

  void generate(GenerateRequest r, std::shared_ptr<GenerateSink> sink) override {
    check(!r.prompt.empty(), "a prompt reaches the Service non-empty");
    for (const int32_t t : r.prompt) check(t >= 0 && t < kVocab, "prompt ids reach the Service inside the vocabulary");
    check(r.session == 0, "HTTP generates in a temporary session");
    check(r.transport == Transport::kHttp, "the request is labelled HTTP");
    check(r.max_tokens >= 1, "max_tokens >= 1");
    check(r.n_ctx >= 1 && r.n_ctx <= kMaxSessionCtx, "n_ctx within max_session_ctx");
    check(static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= r.n_ctx, "the prompt and max_tokens fit n_ctx");
    check(r.top_logprobs >= 0 && r.top_logprobs <= SamplingParams::kMaxLogprobs, "top_logprobs in range");
    check(r.stop_strings.size() <= 16, "at most 16 stop strings");
    for (const std::string& s : r.stop_strings) check(!s.empty() && s.size() <= 256, "stop strings 1..256 bytes");
    SamplingParams p = r.sampling.apply_to(SamplingParams{});
    p.n_logprobs = 0;
    check(static_cast<bool>(p.validate()), "sampling reaches the Service valid");

    const uint32_t pick = static_cast<uint32_t>(r.prompt.front()) + static_cast<uint32_t>(r.prompt.size());
    if (pick % 11 == 0) return sink->on_done(make_error(ErrorCode::kResourceExhausted, "all 256 sessions are in use"));
    const int32_t n = std::min(r.max_tokens, 200);
    for (int32_t i = 0; i < n; ++i) {
      if (sink->cancelled()) return sink->on_done(make_error(ErrorCode::kCancelled, "cancelled"));
      GenerateChunk c;
      const int32_t id = r.prompt[static_cast<size_t>(i) % r.prompt.size()];
      c.tokens = {id};
      c.text = piece(id);  // as the Service's text streams, invalid bytes as U+FFFD
      if (r.top_logprobs > 0) {
        StepResult s;
        s.token = id;
        s.logprob = -0.5f * static_cast<float>(i);
        for (int32_t k = 0; k < r.top_logprobs; ++k)
          s.top.push_back({(id + k) % kVocab, -1.0f - static_cast<float>(k)});
        c.logprobs.push_back(std::move(s));
      }
      sink->on_chunk(std::move(c));
    }
    GenerateSummary sum;
    static constexpr FinishReason kReasons[] = {FinishReason::kStopToken, FinishReason::kStopString,
                                                FinishReason::kMaxTokens, FinishReason::kContextFull,
                                                FinishReason::kAborted,   FinishReason::kShutdown};
    sum.reason = kReasons[pick % 6];
    if (sum.reason == FinishReason::kShutdown) sum.message = "kestreld is shutting down: its drain time ran out";
    sum.prompt_tokens = static_cast<uint32_t>(r.prompt.size());
    sum.completion_tokens = static_cast<uint32_t>(n);
    sink->on_done(std::move(sum));
  }

 private:
  static std::string piece(int32_t id) {
    if (id < 256) return std::string(1, static_cast<char>(id));
    const char b = static_cast<char>(id);
    return std::string{'\xE6', b, '\x97'};  // a CJK character for some ids, bytes that are not UTF-8 for others
  }
  static Error unexpected() { return make_error(ErrorCode::kInternal, "the HTTP API does not call this"); }

  ServiceMetrics metrics_;
};

// The connection's side, on one thread: post() queues work that run() performs in order, as the strand would.
class RecordingExchange final : public Exchange {
 public:
  void respond(Response response) override {
    check(answers_ == 0 && !streaming_, "one answer per request");
    ++answers_;
    status_ = response.status;
    if (response.content_type == "application/json") {
      check(response.body.size() <= kMaxResponseBytes, "a response body is within max_response_bytes");
      const Json j = Json::parse(response.body, nullptr, false);
      check(!j.is_discarded(), "a JSON response parses");
      if (response.status >= 400) check_error(j);
    } else {
      // The metrics page: its size is fixed by its families and buckets, whatever the requests were.
      check(response.status == 200 && response.content_type.starts_with("text/plain"), "only /metrics is not JSON");
      check(response.body.size() <= (1u << 20), "the metrics page stays small");
    }
  }
  void start_events() override {
    check(answers_ == 0 && !streaming_, "one answer per request");
    streaming_ = true;
  }
  void send_event(std::string event) override {
    check(streaming_ && !ended_, "events only inside the stream");
    check(event.size() <= kMaxResponseBytes, "an event is within max_response_bytes");
    check(event.starts_with("data: ") && event.ends_with("\n\n"), "an event is one data line");
    const std::string_view data(event.data() + 6, event.size() - 8);
    check(data.find('\n') == std::string_view::npos, "an event is one line");
    check(!done_, "nothing after [DONE]");
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    const Json j = Json::parse(data, nullptr, false);
    check(!j.is_discarded() && j.is_object(), "an event is a JSON object");
    if (j.contains("error")) check_error(j);
  }
  void end_events() override {
    check(streaming_ && !ended_, "a stream ends once");
    check(done_, "a stream ends with [DONE]");
    ended_ = true;
    ++answers_;
  }
  size_t pending_bytes() const override { return 0; }
  bool peer_gone() const override { return false; }
  void post(std::function<void()> work) override { queue_.push_back(std::move(work)); }

  void run() {
    while (!queue_.empty()) {
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      work();
    }
  }
  bool answered() const { return answers_ == 1 && (!streaming_ || ended_); }
  int status() const { return status_; }

 private:
  static void check_error(const Json& j) {
    check(j.is_object() && j.contains("error") && j["error"].is_object(), "an error is {\"error\": {...}}");
    const Json& e = j["error"];
    check(e.contains("message") && e["message"].is_string() && !e["message"].get<std::string>().empty(),
          "an error has a message");
    check(e.contains("type") && e["type"].is_string(), "an error has a type");
    check(e.contains("param") && (e["param"].is_null() || e["param"].is_string()), "an error has a param");
    check(e.contains("code") && (e["code"].is_null() || e["code"].is_string()), "an error has a code");
  }

  int answers_ = 0;
  int status_ = 0;
  bool streaming_ = false, done_ = false, ended_ = false;
  std::deque<std::function<void()>> queue_;
};

constexpr const char* kTemplate =
    "{%- for m in messages -%}<|{{ m.role }}|>{{ m.content }}\n{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}";

// Answers one request and checks it was answered once.
int answer(OpenAiApi& api, HttpRequest request) {
  auto exchange = std::make_shared<RecordingExchange>();
  api.handle(std::move(request), exchange);
  exchange->run();
  check(exchange->answered(), "every request is answered");
  return exchange->status();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static StrictService service;
  ApiOptions options;
  options.max_concurrent_requests = 1;
  options.max_response_bytes = kMaxResponseBytes;
  OpenAiApi api(options);
  api.attach(service, ServedModel{"fuzz-model", 1700000000, kTemplate, "<s>", "</s>"});

  size_t pos = 0;
  for (int n = 0; n < kMaxRequests && pos < size; ++n) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(kMaxBodyBytes);
    parser.eager(true);
    beast::error_code ec;
    while (!parser.is_done()) {
      size_t used = 0;
      if (pos < size) used = parser.put(boost::asio::buffer(data + pos, size - pos), ec);
      pos += used;
      if (ec == bhttp::error::need_more) ec = {};
      if (ec) break;
      if (used == 0) {  // every byte given and the message is not complete: the client stopped sending
        parser.put_eof(ec);
        if (!ec) ec = bhttp::error::partial_message;
        break;
      }
    }
    if (ec) {
      check(ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category(),
            "the parser fails only with HTTP errors");
      break;  // the connection answers 400 / 413 / 431 (or nothing, for a partial message) and closes
    }
    auto& req = parser.get();
    HttpRequest request;
    request.method = std::string(req.method_string());
    request.target = std::string(req.target());
    request.authorization = std::string(req[bhttp::field::authorization]);
    request.body = std::move(req.body());
    answer(api, std::move(request));
    if (!req.keep_alive()) break;
  }
  // Every completion gave its place back: one more is admitted (not 429).
  const int status =
      answer(api, HttpRequest{"POST", "/v1/completions", "", R"({"prompt": [1], "max_tokens": 1, "stream": true})"});
  check(status != 429, "every completion gives back its place among max_concurrent_requests");
  return 0;
}
