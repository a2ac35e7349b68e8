// RpcHandlers against a fake Service: the ErrorCode → gRPC code table, validation messages, kestrel.v1 conversion of
// requests and results, UTF-8 replacement, and the Generate stream adapter.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "daemon/server/rpc_handlers.h"
#include "tests/daemon/server/fake_service.h"

namespace kestrel::daemon {
namespace {

using testing::FakeService;

TEST(RpcStatusTest, EveryErrorCodeMapsToItsGrpcCode) {
  const std::pair<ErrorCode, int> table[] = {
      {ErrorCode::kInvalidArgument, rpc_code::kInvalidArgument},
      {ErrorCode::kNotFound, rpc_code::kNotFound},
      {ErrorCode::kOutOfRange, rpc_code::kOutOfRange},
      {ErrorCode::kDataLoss, rpc_code::kDataLoss},
      {ErrorCode::kUnsupported, rpc_code::kUnimplemented},
      {ErrorCode::kIo, rpc_code::kInternal},
      {ErrorCode::kResourceExhausted, rpc_code::kResourceExhausted},
      {ErrorCode::kFailedPrecondition, rpc_code::kFailedPrecondition},
      {ErrorCode::kCancelled, rpc_code::kCancelled},
      {ErrorCode::kDeadlineExceeded, rpc_code::kDeadlineExceeded},
      {ErrorCode::kUnavailable, rpc_code::kUnavailable},
      {ErrorCode::kInternal, rpc_code::kInternal},
  };
  for (const auto& [code, grpc_code] : table) {
    const RpcStatus s = to_rpc_status(make_error(code, "why"));
    EXPECT_EQ(s.code, grpc_code) << error_code_name(code);
    EXPECT_EQ(s.message, "why");
    EXPECT_FALSE(s.ok());
  }
  EXPECT_TRUE(RpcStatus{}.ok());
}

TEST(RpcStatusTest, CodeNames) {
  EXPECT_STREQ(rpc_code_name(rpc_code::kOk), "OK");
  EXPECT_STREQ(rpc_code_name(rpc_code::kNotFound), "NOT_FOUND");
  EXPECT_STREQ(rpc_code_name(rpc_code::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(rpc_code_name(rpc_code::kUnauthenticated), "UNAUTHENTICATED");
  EXPECT_STREQ(rpc_code_name(-1), "UNKNOWN");
  EXPECT_STREQ(rpc_code_name(17), "UNKNOWN");
}

TEST(Utf8SanitizeTest, ReplacesEachInvalidByte) {
  EXPECT_EQ(utf8_sanitize("plain"), "plain");
  EXPECT_EQ(utf8_sanitize("h\xC3\xA9"), "h\xC3\xA9");  // é stays
  EXPECT_EQ(utf8_sanitize("a\xFF"
                          "b"),
            "a\xEF\xBF\xBD"
            "b");                                                    // stray byte
  EXPECT_EQ(utf8_sanitize("\xE4\xBD"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // cut 3-byte char
  EXPECT_EQ(utf8_sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(utf8_sanitize(""), "");
}

class RpcHandlersTest : public ::testing::Test {
 protected:
  FakeService service_;
  RpcHandlers handlers_{service_, RpcLimits{}, ServerIdentity{"1.2.3", Clock::now()}};

  uint64_t new_session() {
    v1::SessionInfo info;
    EXPECT_TRUE(handlers_.create_session(v1::CreateSessionRequest{}, 0, &info).ok());
    return info.session_id();
  }

  // Runs a step and waits for its callback.
  std::pair<RpcStatus, v1::StepResponse> step(const v1::StepRequest& req, Deadline deadline = std::nullopt) {
    std::promise<std::pair<RpcStatus, v1::StepResponse>> p;
    auto f = p.get_future();
    handlers_.step(req, deadline, [&p](RpcStatus s, v1::StepResponse r) { p.set_value({std::move(s), std::move(r)}); });
    return f.get();
  }
};

// Collects a Generate stream.
class Collector final : public RpcHandlers::GenerateStream {
 public:
  void on_chunk(v1::GenerateChunk chunk) override {
    std::lock_guard lock(mu);
    chunks.push_back(std::move(chunk));
  }
  void on_done(RpcStatus s, v1::GenerateChunk l) override {
    std::lock_guard lock(mu);
    status = std::move(s);
    last = std::move(l);
    done = true;
    cv.notify_all();
  }
  bool cancelled() const override { return cancel.load(); }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [this] { return done; });
  }

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<v1::GenerateChunk> chunks;
  RpcStatus status;
  v1::GenerateChunk last;
  std::atomic<bool> cancel{false};
};

RpcStatus generate(RpcHandlers& h, const v1::GenerateRequest& req, std::shared_ptr<Collector>* out = nullptr) {
  auto c = std::make_shared<Collector>();
  h.generate(req, std::nullopt, 0, c);
  c->wait();
  if (out) *out = c;
  return c->status;
}

TEST_F(RpcHandlersTest, ModelInfoAndServerStatus) {
  v1::ModelInfo m;
  ASSERT_TRUE(handlers_.get_model_info({}, &m).ok());
  EXPECT_EQ(m.architecture(), "qwen35moe");
  EXPECT_EQ(m.n_vocab(), FakeService::kVocab);
  EXPECT_EQ(m.max_session_ctx(), 2048);
  ASSERT_EQ(m.eos_token_ids_size(), 1);
  EXPECT_EQ(m.eos_token_ids(0), 999);
  ASSERT_EQ(m.placement_size(), 1);
  EXPECT_EQ(m.placement(0).bytes(), 1234u);
  EXPECT_EQ(m.file_bytes(), 4321u);
  EXPECT_EQ(m.chat_template(), "{{ messages[0].content }}");

  new_session();
  handlers_.set_shm_clients(3);
  v1::ServerStatus s;
  ASSERT_TRUE(handlers_.get_server_status({}, &s).ok());
  EXPECT_EQ(s.version(), "1.2.3");
  EXPECT_TRUE(s.serving());
  EXPECT_EQ(s.sessions(), 1u);
  EXPECT_EQ(s.max_sessions(), ServiceLimits{}.max_sessions);
  EXPECT_EQ(s.ticks(), 7u);
  EXPECT_EQ(s.shm_clients(), 3u);
  EXPECT_GE(s.uptime_s(), 0.0);
  EXPECT_EQ(s.kv_cache_tokens(), 0u) << "the fake engine has no shared pool";

  service_.cache = EngineCachePool{65536, 1280, 671088640};
  ASSERT_TRUE(handlers_.get_server_status({}, &s).ok());
  EXPECT_EQ(s.kv_cache_tokens(), 65536u);
  EXPECT_EQ(s.kv_cache_tokens_held(), 1280u);
  EXPECT_EQ(s.kv_cache_bytes(), 671088640u);
}

TEST_F(RpcHandlersTest, TokenizeAndDetokenize) {
  v1::TokenizeRequest treq;
  treq.set_text("hi");
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(handlers_.tokenize(treq, &tresp).ok());
  ASSERT_EQ(tresp.tokens_size(), 2);
  EXPECT_EQ(tresp.tokens(0), 'h');

  v1::DetokenizeRequest dreq;
  for (int t : {int{'o'}, int{'k'}, 0xE4, 0xBD}) dreq.add_tokens(t);  // ends inside a 3-byte character
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(handlers_.detokenize(dreq, &dresp).ok());
  EXPECT_EQ(dresp.raw(), "ok\xE4\xBD");
  EXPECT_EQ(dresp.text(), "ok\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_F(RpcHandlersTest, DetokenizeNamesTheBadId) {
  v1::DetokenizeRequest req;
  for (int t : {1, 2, 3, 999999}) req.add_tokens(t);
  v1::DetokenizeResponse resp;
  RpcStatus s = handlers_.detokenize(req, &resp);
  EXPECT_EQ(s.code, rpc_code::kInvalidArgument);
  EXPECT_EQ(s.message, "tokens: token id 999999 at index 3 is outside the vocabulary [0, 1000)");
  req.set_tokens(0, -5);
  s = handlers_.detokenize(req, &resp);
  EXPECT_EQ(s.message, "tokens: token id -5 at index 0 is outside the vocabulary [0, 1000)");
}

// Responses are sized before they are built: a Detokenize whose text and raw bytes would pass the limit is
// refused with RESOURCE_EXHAUSTED naming both sizes, and the Service is told to build at most half the limit.
TEST(RpcResponseLimitTest, DetokenizeOverTheLimitIsRefusedBeforeItIsBuilt) {
  FakeService service;
  RpcLimits limits;
  limits.max_response_bytes = 100;
  RpcHandlers handlers(service, limits);
  v1::DetokenizeRequest req;
  v1::DetokenizeResponse resp;
  // 48 ASCII bytes: text 48 + raw 48, each with a tag and a length byte: 100 bytes, exactly the limit.
  for (int i = 0; i < 48; ++i) req.add_tokens('a');
  RpcStatus s = handlers.detokenize(req, &resp);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(resp.ByteSizeLong(), 100u);
  EXPECT_EQ(service.last_detokenize_max_bytes.load(), 50u);
  // One more token: 102 bytes.
  req.add_tokens('a');
  resp.Clear();
  s = handlers.detokenize(req, &resp);
  EXPECT_EQ(s.code, rpc_code::kResourceExhausted);
  EXPECT_EQ(s.message,
            "Detokenize: the response would be 102 bytes (49 of text, 49 raw), over the limit of 100 bytes per "
            "response; split the request");
  EXPECT_EQ(resp.ByteSizeLong(), 0u) << "nothing is built for a refused response";
  // Raw bytes over half the limit: refused by the Service before it decodes anything.
  for (int i = 0; i < 10; ++i) req.add_tokens('a');
  s = handlers.detokenize(req, &resp);
  EXPECT_EQ(s.code, rpc_code::kResourceExhausted);
  EXPECT_EQ(s.message,
            "Detokenize: 59 bytes, more than 50 (the response carries them as text and raw), over the limit of 100 "
            "bytes per response; split the request");
  // Invalid UTF-8 triples the text: 30 stray bytes are 90 bytes of U+FFFD.
  req.clear_tokens();
  for (int i = 0; i < 30; ++i) req.add_tokens(0xFF);
  s = handlers.detokenize(req, &resp);
  EXPECT_EQ(s.code, rpc_code::kResourceExhausted);
  EXPECT_EQ(s.message,
            "Detokenize: the response would be 124 bytes (90 of text, 30 raw), over the limit of 100 bytes per "
            "response; split the request");
}

TEST(RpcResponseLimitTest, TheTransportsOwnLimitIsNamedWhenItIsSmaller) {
  FakeService service;
  RpcHandlers handlers(service);  // 16 MiB by default
  v1::DetokenizeRequest req;
  for (int i = 0; i < 40; ++i) req.add_tokens('a');
  v1::DetokenizeResponse resp;
  RpcStatus s = handlers.detokenize(req, &resp, /*transport_max_bytes=*/60);
  EXPECT_EQ(s.code, rpc_code::kResourceExhausted);
  EXPECT_NE(s.message.find("over the limit of 60 bytes per message on this transport (gRPC allows 16777216)"),
            std::string::npos)
      << s.message;
  EXPECT_TRUE(handlers.detokenize(req, &resp, /*transport_max_bytes=*/84).ok());
}

TEST(RpcResponseLimitTest, TokenizeOverTheLimitIsRefused) {
  FakeService service;
  RpcLimits limits;
  limits.max_response_bytes = 100;
  RpcHandlers handlers(service, limits);
  // The fake gives one token per byte: 'a' (97) is a 1-byte varint; 0xC3 (195) takes 2.
  v1::TokenizeRequest req;
  req.set_text(std::string(98, 'a'));  // 1 tag + 1 length + 98 = 100
  v1::TokenizeResponse resp;
  ASSERT_TRUE(handlers.tokenize(req, &resp).ok());
  EXPECT_EQ(resp.ByteSizeLong(), 100u);
  req.set_text(std::string(50, '\xC3'));  // 1 + 1 + 100 = 102
  resp.Clear();
  RpcStatus s = handlers.tokenize(req, &resp);
  EXPECT_EQ(s.code, rpc_code::kResourceExhausted);
  EXPECT_EQ(s.message,
            "Tokenize: the 50 tokens would take 102 bytes, over the limit of 100 bytes per response; split the "
            "request");
  EXPECT_EQ(resp.tokens_size(), 0);
}

TEST(Utf8SanitizeTest, SizeMatchesTheSanitizedText) {
  for (const std::string s : {"plain", "h\xC3\xA9",
                              "a\xFF"
                              "b",
                              "\xE4\xBD", "\xC0\xAF", "", "\xF0\x9F\x98\x80!"}) {
    EXPECT_EQ(utf8_sanitized_size(s), utf8_sanitize(s).size()) << s;
  }
}

TEST_F(RpcHandlersTest, ServiceErrorsPassThroughWithTheirCode) {
  service_.fail_next(make_error(ErrorCode::kResourceExhausted, "256 sessions are open (max_sessions)"));
  v1::SessionInfo info;
  RpcStatus s = handlers_.create_session({}, 0, &info);
  EXPECT_EQ(s.code, rpc_code::kResourceExhausted);
  EXPECT_EQ(s.message, "256 sessions are open (max_sessions)");

  v1::ResetSessionRequest reset;
  reset.set_session_id(42);
  s = handlers_.reset_session(reset, &info);
  EXPECT_EQ(s.code, rpc_code::kNotFound);
  EXPECT_EQ(s.message, "session 42 does not exist");

  service_.fail_next(make_error(ErrorCode::kUnavailable, "draining"));
  v1::TokenizeResponse tr;
  EXPECT_EQ(handlers_.tokenize({}, &tr).code, rpc_code::kUnavailable);
}

TEST_F(RpcHandlersTest, SessionIdZeroIsRefused) {
  v1::SessionInfo info;
  v1::CloneSessionRequest clone;
  RpcStatus s = handlers_.clone_session(clone, 0, &info);
  EXPECT_EQ(s.code, rpc_code::kInvalidArgument);
  EXPECT_NE(s.message.find("session_id is 0"), std::string::npos) << s.message;
  v1::CloseSessionResponse cr;
  EXPECT_EQ(handlers_.close_session({}, &cr).code, rpc_code::kInvalidArgument);
  v1::AbortResponse ar;
  EXPECT_EQ(handlers_.abort({}, &ar).code, rpc_code::kInvalidArgument);
}

TEST_F(RpcHandlersTest, CreateSessionConvertsOptions) {
  v1::CreateSessionRequest req;
  req.set_n_ctx(512);
  req.set_idle_ttl_s(30);
  req.mutable_sampling()->set_temperature(0.0f);
  req.mutable_sampling()->set_seed(9);
  v1::SessionInfo info;
  ASSERT_TRUE(handlers_.create_session(req, /*owner=*/55, &info).ok());
  EXPECT_NE(info.session_id(), 0u);
  EXPECT_EQ(info.n_ctx(), 512);
  ASSERT_TRUE(service_.last_create.has_value());
  EXPECT_EQ(service_.last_create->owner, 55u);
  EXPECT_EQ(service_.last_create->idle_ttl, std::chrono::seconds(30));
  EXPECT_EQ(service_.last_create->sampling.temperature, 0.0f);
  EXPECT_EQ(service_.last_create->sampling.seed, 9u);
  EXPECT_FALSE(service_.last_create->sampling.top_p.has_value());

  req.set_n_ctx(-1);
  RpcStatus s = handlers_.create_session(req, 0, &info);
  EXPECT_EQ(s.code, rpc_code::kInvalidArgument);
  EXPECT_EQ(s.message, "n_ctx must be >= 0 (0 = the daemon's default), got -1");
  req.set_n_ctx(0);
  req.mutable_sampling()->set_top_p(1.5f);
  s = handlers_.create_session(req, 0, &info);
  EXPECT_EQ(s.code, rpc_code::kInvalidArgument);
  EXPECT_EQ(s.message, "sampling parameter top_p must be in (0, 1] (1 = off), got 1.5");
}

TEST_F(RpcHandlersTest, StepConvertsAndAnswers) {
  v1::StepRequest req;
  req.set_session_id(new_session());
  req.add_tokens(5);
  req.add_tokens(41);
  req.set_top_logprobs(3);
  req.mutable_sampling()->set_top_k(7);
  const Deadline deadline = Clock::now() + std::chrono::seconds(5);
  auto [status, resp] = step(req, deadline);
  ASSERT_TRUE(status.ok()) << status.message;
  EXPECT_EQ(resp.token(), 42);
  EXPECT_EQ(resp.n_past(), 2);
  EXPECT_FLOAT_EQ(resp.logprob(), -0.5f);
  ASSERT_EQ(resp.top_logprobs_size(), 3);
  EXPECT_EQ(resp.top_logprobs(2).token(), 2);
  ASSERT_TRUE(service_.last_step.has_value());
  EXPECT_EQ(service_.last_step->deadline, deadline);
  EXPECT_EQ(service_.last_step->sampling.top_k, 7);
  EXPECT_EQ(service_.last_step->top_logprobs, 3);
}

TEST_F(RpcHandlersTest, StepValidation) {
  const uint64_t sid = new_session();
  v1::StepRequest req;
  req.set_session_id(sid);
  auto [s1, r1] = step(req);
  EXPECT_EQ(s1.code, rpc_code::kInvalidArgument);
  EXPECT_NE(s1.message.find("tokens is empty"), std::string::npos) << s1.message;

  req.add_tokens(1);
  req.add_tokens(1000);
  auto [s2, r2] = step(req);
  EXPECT_EQ(s2.message, "tokens: token id 1000 at index 1 is outside the vocabulary [0, 1000)");

  req.set_tokens(1, 2);
  req.set_top_logprobs(21);
  auto [s3, r3] = step(req);
  EXPECT_EQ(s3.code, rpc_code::kInvalidArgument);
  EXPECT_EQ(s3.message, "top_logprobs must be in [0, 20], got 21");

  req.set_top_logprobs(-1);
  EXPECT_EQ(step(req).first.message, "top_logprobs must be in [0, 20], got -1");

  req.set_top_logprobs(0);
  req.mutable_sampling()->set_temperature(-1.0f);
  auto [s4, r4] = step(req);
  EXPECT_EQ(s4.message, "sampling parameter temperature must be a finite number >= 0 (0 = greedy), got -1");

  req.clear_sampling();
  req.set_session_id(424242);
  auto [s5, r5] = step(req);
  EXPECT_EQ(s5.code, rpc_code::kNotFound);
  EXPECT_EQ(s5.message, "session 424242 does not exist");
}

TEST_F(RpcHandlersTest, GenerateStreamsChunksAndSummary) {
  v1::GenerateRequest req;
  req.set_session_id(new_session());
  req.set_text("abc");
  req.set_max_tokens(4);
  req.set_top_logprobs(1);
  req.add_stop_strings("\n\n");
  req.add_stop_tokens(7);
  std::shared_ptr<Collector> c;
  ASSERT_TRUE(generate(handlers_, req, &c).ok()) << c->status.message;
  ASSERT_EQ(c->chunks.size(), 4u);
  EXPECT_EQ(c->chunks[0].tokens(0), 'a');
  EXPECT_EQ(c->chunks[3].text(), "d");
  ASSERT_EQ(c->chunks[0].logprobs_size(), 1);
  EXPECT_FLOAT_EQ(c->chunks[0].logprobs(0).logprob(), -0.25f);
  EXPECT_EQ(c->chunks[0].logprobs(0).top(0).token(), 'a');
  EXPECT_EQ(c->chunks[0].finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(c->last.finish_reason(), v1::FINISH_REASON_MAX_TOKENS);
  EXPECT_EQ(c->last.prompt_tokens(), 3u);
  EXPECT_EQ(c->last.completion_tokens(), 4u);
  EXPECT_EQ(c->last.n_past(), 7);
  EXPECT_EQ(c->last.tokens_size(), 0);
  // The text prompt went through Service::tokenize.
  ASSERT_TRUE(service_.last_generate.has_value());
  EXPECT_EQ(service_.last_generate->prompt, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(service_.last_generate->stop_strings, (std::vector<std::string>{"\n\n"}));
  EXPECT_EQ(service_.last_generate->stop_tokens, (std::vector<int32_t>{7}));
}

TEST_F(RpcHandlersTest, GenerateTemporarySessionCarriesOwnerAndNctx) {
  v1::GenerateRequest req;
  req.mutable_tokens()->add_ids(1);
  req.set_max_tokens(1);
  req.set_n_ctx(256);
  auto c = std::make_shared<Collector>();
  handlers_.generate(req, std::nullopt, /*owner=*/99, c);
  c->wait();
  ASSERT_TRUE(c->status.ok());
  EXPECT_EQ(service_.last_generate->owner, 99u);
  EXPECT_EQ(service_.last_generate->n_ctx, 256);
  EXPECT_EQ(service_.last_generate->session, 0u);
}

TEST_F(RpcHandlersTest, GenerateValidation) {
  auto message = [&](const v1::GenerateRequest& r) {
    const RpcStatus s = generate(handlers_, r);
    EXPECT_EQ(s.code, rpc_code::kInvalidArgument) << s.message;
    return s.message;
  };
  v1::GenerateRequest req;
  req.set_max_tokens(4);
  EXPECT_EQ(message(req), "the request has no prompt; set text or tokens");
  req.set_text("");
  EXPECT_EQ(message(req), "prompt text is empty; send at least one character or token");
  req.mutable_tokens();
  EXPECT_EQ(message(req), "prompt tokens is empty; send at least one token");
  req.mutable_tokens()->add_ids(-3);
  EXPECT_EQ(message(req), "prompt tokens: token id -3 at index 0 is outside the vocabulary [0, 1000)");
  req.mutable_tokens()->set_ids(0, 3);
  req.set_max_tokens(0);
  EXPECT_EQ(message(req), "max_tokens must be > 0, got 0");
  req.set_max_tokens(4);
  req.set_session_id(5);
  req.set_n_ctx(100);
  EXPECT_EQ(message(req),
            "n_ctx applies to a temporary session (session_id 0) only; session 5 keeps the n_ctx it was created with");
  req.set_session_id(0);
  req.set_n_ctx(0);
  for (int i = 0; i < 17; ++i) req.add_stop_strings("x");
  EXPECT_EQ(message(req), "at most 16 stop_strings are allowed, got 17");
  req.clear_stop_strings();
  req.add_stop_strings("ok");
  req.add_stop_strings("");
  EXPECT_EQ(message(req), "stop_strings[1] is empty");
  req.set_stop_strings(1, std::string(257, 'y'));
  EXPECT_EQ(message(req), "stop_strings[1] is 257 bytes; the limit is 256");
  req.clear_stop_strings();
  for (int i = 0; i < 65; ++i) req.add_stop_tokens(1);
  EXPECT_EQ(message(req), "at most 64 stop_tokens are allowed, got 65");
  req.clear_stop_tokens();
  req.add_stop_tokens(5000);
  EXPECT_EQ(message(req), "stop_tokens: token id 5000 at index 0 is outside the vocabulary [0, 1000)");
  req.clear_stop_tokens();
  req.set_top_logprobs(50);
  EXPECT_EQ(message(req), "top_logprobs must be in [0, 20], got 50");
  req.set_top_logprobs(0);
  req.mutable_sampling()->set_min_p(2.0f);
  EXPECT_EQ(message(req), "sampling parameter min_p must be in [0, 1] (0 = off), got 2");
  req.clear_sampling();
  EXPECT_TRUE(generate(handlers_, req).ok());
}

TEST_F(RpcHandlersTest, GenerateErrorsAndCancellation) {
  v1::GenerateRequest req;
  req.set_session_id(1234);
  req.mutable_tokens()->add_ids(1);
  req.set_max_tokens(3);
  service_.fail_next(make_error(ErrorCode::kFailedPrecondition, "session 1234 is busy with another request"));
  std::shared_ptr<Collector> c;
  const RpcStatus s = generate(handlers_, req, &c);
  EXPECT_EQ(s.code, rpc_code::kFailedPrecondition);
  EXPECT_EQ(s.message, "session 1234 is busy with another request");

  // A stream that reports cancelled: the Service stops and the status is CANCELLED.
  auto cancelled = std::make_shared<Collector>();
  cancelled->cancel = true;
  handlers_.generate(req, std::nullopt, 0, cancelled);
  cancelled->wait();
  EXPECT_EQ(cancelled->status.code, rpc_code::kCancelled);
  EXPECT_TRUE(cancelled->chunks.empty());
  EXPECT_TRUE(service_.generate_saw_cancel);
}

}  // namespace
}  // namespace kestrel::daemon

namespace kestrel::daemon {
namespace {

// kestreld binds its listener before the model is loaded: handlers without a Service answer every call UNAVAILABLE
// (so clients retry) until attach(), and then serve normally.
TEST(RpcHandlersLoadingTest, UnavailableUntilAttached) {
  RpcHandlers h(RpcLimits{}, ServerIdentity{"1.2.3", Clock::now()});
  EXPECT_FALSE(h.attached());
  v1::ModelInfo info;
  RpcStatus s = h.get_model_info(v1::GetModelInfoRequest{}, &info);
  EXPECT_EQ(s.code, rpc_code::kUnavailable);
  EXPECT_NE(s.message.find("loading"), std::string::npos) << s.message;
  v1::SessionInfo session;
  EXPECT_EQ(h.create_session(v1::CreateSessionRequest{}, 0, &session).code, rpc_code::kUnavailable);
  v1::StepRequest step;
  step.set_session_id(1);
  step.add_tokens(1);
  RpcStatus step_status;
  h.step(step, std::nullopt, [&](RpcStatus st, v1::StepResponse) { step_status = std::move(st); });
  EXPECT_EQ(step_status.code, rpc_code::kUnavailable);  // answered on the calling thread
  v1::GenerateRequest gen;
  gen.set_text("hi");
  gen.set_max_tokens(1);
  EXPECT_EQ(generate(h, gen).code, rpc_code::kUnavailable);

  testing::FakeService service;
  h.attach(service);
  EXPECT_TRUE(h.attached());
  ASSERT_TRUE(h.get_model_info(v1::GetModelInfoRequest{}, &info).ok());
  EXPECT_EQ(info.n_vocab(), testing::FakeService::kVocab);
  EXPECT_TRUE(h.create_session(v1::CreateSessionRequest{}, 0, &session).ok());
}

}  // namespace
}  // namespace kestrel::daemon
