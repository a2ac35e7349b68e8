// End to end over gRPC: the real Service (make_service over make_reference_engine) on the golden qwen35moe fixture
// model, behind a GrpcServer on a temporary Unix socket, driven through Client::connect("unix://..."). Greedy tokens
// from Step and Generate are checked against the scalar reference forward pass run in-process (argmax, lowest id on
// ties: the sampler's temperature-0 rule), so the test checks that tokens, sessions and streaming survive the trip
// through protobuf, gRPC and the engine loop unchanged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "client/lib/client.h"
#include "core/engine/reference_engine.h"
#include "core/model/model.h"
#include "core/reference/forward.h"
#include "core/reference/model_weights.h"
#include "core/reference/session_state.h"
#include "daemon/engine/service.h"
#include "daemon/server/grpc_server.h"
#include "daemon/server/rpc_handlers.h"
#include "tests/daemon/scratch_dir.h"

namespace kestrel::daemon {
namespace {

const std::string kModelPath =
    std::string(KESTREL_TEST_DATA_DIR) + "/../golden/fixtures/golden-qwen35moe/golden-qwen35moe.gguf";

// The first tokens of the golden fixture's sequence (ids of ordinary tokens of the fixture's vocabulary).
const std::vector<int32_t> kPrompt = {869, 362, 864, 289, 754, 950};
constexpr int kNewTokens = 6;

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
  }
  return best;
}

// Greedy continuation of `prompt` by the reference forward pass (recurrent GDN form, as the reference engine runs).
std::vector<int32_t> oracle_greedy(const Model& model, const std::vector<int32_t>& prompt, int n) {
  auto weights = ref::RefModelWeights::from_catalog(model.catalog());
  EXPECT_TRUE(weights) << weights.error().to_string();
  auto session = ref::SessionState::create(model.hparams(), 256);
  EXPECT_TRUE(session) << session.error().to_string();
  ref::ForwardOptions options;
  options.gdn_mode = ref::GdnMode::kRecurrent;
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  for (int i = 0; i < n; ++i) {
    ref::ForwardOutput fo;
    const Status s = ref::forward(*weights, *session, feed, options, &fo);
    EXPECT_TRUE(s) << s.error().to_string();
    out.push_back(argmax(fo.logits));
    feed = {out.back()};
  }
  return out;
}

class GrpcEndToEndTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = Model::open(kModelPath);
    ASSERT_TRUE(model) << model.error().to_string();
    model_ = std::move(model).value().release();
    oracle_ = new std::vector<int32_t>(oracle_greedy(*model_, kPrompt, kNewTokens));
  }
  static void TearDownTestSuite() {
    delete oracle_;
    delete model_;
  }

  void SetUp() override {
    ASSERT_NE(model_, nullptr);
    auto engine = make_reference_engine(*model_, 4);
    ASSERT_TRUE(engine) << engine.error().to_string();
    engine_ = std::move(engine).value();
    ServiceLimits limits;
    limits.default_n_ctx = 256;
    auto service = make_service(*model_, *engine_, limits);
    ASSERT_TRUE(service) << service.error().to_string();
    service_ = std::move(service).value();
    handlers_ = std::make_unique<RpcHandlers>(*service_, RpcLimits{}, ServerIdentity{"test", Clock::now()});
    GrpcServerOptions options;
    options.unix_socket_path = (dir_.path() / "kestreld.sock").string();
    auto server = GrpcServer::create(*handlers_, options);
    ASSERT_TRUE(server) << server.error().to_string();
    server_ = std::move(server).value();
    server_->set_serving(true);
    client::ClientOptions copt;
    copt.timeout = std::chrono::seconds(60);
    auto c = client::Client::connect("unix://" + options.unix_socket_path, copt);
    ASSERT_TRUE(c) << c.error().to_string();
    client_ = std::move(c).value();
  }

  void TearDown() override {
    client_.reset();
    if (server_) server_->set_serving(false);
    if (service_) service_->drain(Clock::now() + std::chrono::seconds(5));
    if (server_) server_->shutdown(Clock::now() + std::chrono::seconds(5));
    server_.reset();
    handlers_.reset();
    service_.reset();
    engine_.reset();
  }

  static v1::SamplingParams greedy() {
    v1::SamplingParams p;
    p.set_temperature(0.0f);
    p.set_repetition_penalty(1.0f);
    p.set_presence_penalty(0.0f);
    p.set_frequency_penalty(0.0f);
    return p;
  }

  static inline Model* model_ = nullptr;
  static inline std::vector<int32_t>* oracle_ = nullptr;
  ::kestrel::test::ScratchDir dir_{"kestrel-e2e"};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<RpcHandlers> handlers_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(GrpcEndToEndTest, ModelInfoDescribesTheFixture) {
  auto info = client_->model_info();
  ASSERT_TRUE(info) << info.error().to_string();
  EXPECT_EQ(info->architecture(), "qwen35moe");
  EXPECT_EQ(info->n_vocab(), static_cast<int32_t>(model_->hparams().n_vocab));
  EXPECT_EQ(info->engine(), "reference");
  EXPECT_GT(info->placement_size(), 0);
  auto status = client_->server_status();
  ASSERT_TRUE(status);
  EXPECT_TRUE(status->serving());
  EXPECT_EQ(status->version(), "test");
}

TEST_F(GrpcEndToEndTest, TokenizeDetokenizeRoundTrip) {
  v1::TokenizeRequest treq;
  treq.set_text("Hello, world");
  auto toks = client_->tokenize(treq);
  ASSERT_TRUE(toks) << toks.error().to_string();
  ASSERT_GT(toks->tokens_size(), 0);
  v1::DetokenizeRequest dreq;
  *dreq.mutable_tokens() = toks->tokens();
  auto text = client_->detokenize(dreq);
  ASSERT_TRUE(text) << text.error().to_string();
  EXPECT_EQ(text->raw(), "Hello, world");
  EXPECT_EQ(text->text(), "Hello, world");
}

TEST_F(GrpcEndToEndTest, GreedyStepsMatchTheReference) {
  v1::CreateSessionRequest creq;
  *creq.mutable_sampling() = greedy();
  auto session = client_->create_session(creq);
  ASSERT_TRUE(session) << session.error().to_string();
  std::vector<int32_t> got;
  std::vector<int32_t> feed = kPrompt;
  for (int i = 0; i < kNewTokens; ++i) {
    v1::StepRequest sreq;
    sreq.set_session_id(session->session_id());
    sreq.mutable_tokens()->Add(feed.begin(), feed.end());
    sreq.set_top_logprobs(3);
    auto r = client_->step(sreq);
    ASSERT_TRUE(r) << r.error().to_string();
    EXPECT_EQ(r->top_logprobs_size(), 3);
    EXPECT_EQ(r->top_logprobs(0).token(), r->token());  // greedy picks the most probable token
    got.push_back(r->token());
    feed = {r->token()};
  }
  EXPECT_EQ(got, *oracle_);
}

TEST_F(GrpcEndToEndTest, GreedyGenerateMatchesTheReferenceAndLeavesAPendingToken) {
  v1::CreateSessionRequest creq;
  *creq.mutable_sampling() = greedy();
  auto session = client_->create_session(creq);
  ASSERT_TRUE(session);
  v1::GenerateRequest greq;
  greq.set_session_id(session->session_id());
  greq.mutable_tokens()->mutable_ids()->Add(kPrompt.begin(), kPrompt.end());
  greq.set_max_tokens(kNewTokens);
  greq.set_ignore_eos(true);
  std::vector<int32_t> got;
  auto last = client_->generate(greq, [&](const v1::GenerateChunk& c) {
    got.insert(got.end(), c.tokens().begin(), c.tokens().end());
    return true;
  });
  ASSERT_TRUE(last) << last.error().to_string();
  EXPECT_EQ(got, *oracle_);
  EXPECT_EQ(last->finish_reason(), v1::FINISH_REASON_MAX_TOKENS);
  EXPECT_EQ(last->prompt_tokens(), kPrompt.size());
  EXPECT_EQ(last->completion_tokens(), static_cast<uint32_t>(kNewTokens));
  // Every emitted token is in the history (the last one pending, fed by the next request).
  EXPECT_EQ(last->n_past(), static_cast<int64_t>(kPrompt.size()) + kNewTokens);

  v1::StepRequest sreq;
  sreq.set_session_id(session->session_id());
  sreq.add_tokens(oracle_->front());
  auto r = client_->step(sreq);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->n_past(), static_cast<int64_t>(kPrompt.size()) + kNewTokens + 1);
}

TEST_F(GrpcEndToEndTest, ErrorsFromTheRealService) {
  v1::StepRequest sreq;
  sreq.set_session_id(123456789);
  sreq.add_tokens(1);
  auto r = client_->step(sreq);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(r.error().message.rfind("NOT_FOUND: ", 0), 0u) << r.error().message;

  auto session = client_->create_session({});
  ASSERT_TRUE(session);
  sreq.set_session_id(session->session_id());
  sreq.set_tokens(0, static_cast<int32_t>(model_->hparams().n_vocab));
  r = client_->step(sreq);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("is outside the vocabulary"), std::string::npos) << r.error().message;

  v1::CreateSessionRequest big;
  big.set_n_ctx(1 << 30);
  auto s2 = client_->create_session(big);
  ASSERT_FALSE(s2);
  EXPECT_EQ(s2.error().code, ErrorCode::kResourceExhausted) << s2.error().message;
}

}  // namespace
}  // namespace kestrel::daemon
