// ServiceMetrics as the real Service records them (service_metrics.h): each request under its own transport label, a
// generation's tokens, latencies and finish class, a step, a refusal at admission, an abort, and the running and
// waiting gauges back at zero once everything ended.
#include <gtest/gtest.h>

#include "tests/daemon/engine/engine_test_util.h"

namespace kestrel::daemon {
namespace {

using test::gen_request;
using test::generate_sync;
using test::iota_tokens;
using test::ServiceFixture;
using test::step_sync;
using test::test_limits;

const ServiceMetrics::PerTransport& of(const ServiceMetrics::Snapshot& s, Transport t) {
  return s.transports[static_cast<size_t>(t)];
}

TEST(ServiceMetrics, EachRequestUnderItsTransport) {
  ServiceFixture f = ServiceFixture::make("golden-qwen35moe", test_limits());
  ASSERT_TRUE(f.service);
  Service& s = *f.service;

  // A generation over "shm": 7 prompt tokens, 5 generated (max_tokens, ignore_eos).
  GenerateRequest g = gen_request(0, iota_tokens(7, 3), 5);
  g.ignore_eos = true;
  g.transport = Transport::kShm;
  auto sink = generate_sync(s, g);
  ASSERT_TRUE(sink->result()) << sink->result().error().to_string();

  // A step over "grpc" on a session of its own: 4 tokens in, one sampled.
  auto session = s.create_session(SessionOptions{});
  ASSERT_TRUE(session);
  StepRequest st;
  st.session = session->id;
  st.tokens = iota_tokens(4, 10);
  st.transport = Transport::kGrpc;
  ASSERT_TRUE(step_sync(s, st));

  // A refusal at admission over "http": a token outside the vocabulary.
  GenerateRequest bad = gen_request(0, {-1}, 3);
  bad.transport = Transport::kHttp;
  auto refused = generate_sync(s, bad);
  ASSERT_FALSE(refused->result());

  const ServiceMetrics::Snapshot m = s.metrics().snapshot();
  const auto& shm = of(m, Transport::kShm);
  EXPECT_EQ(shm.success[static_cast<size_t>(FinishClass::kLength)], 1u);
  EXPECT_EQ(shm.prompt_tokens, 7u);
  EXPECT_EQ(shm.generation_tokens, 5u);
  EXPECT_EQ(shm.ttft.count, 1u);
  EXPECT_EQ(shm.inter_token.count, 4u);
  EXPECT_EQ(shm.e2e.count, 1u);
  EXPECT_EQ(shm.queue_time.count, 1u);
  EXPECT_GT(shm.e2e.sum, 0.0);
  EXPECT_GE(shm.e2e.sum, shm.ttft.sum) << "the end comes after the first token";

  const auto& grpc = of(m, Transport::kGrpc);
  EXPECT_EQ(grpc.success[static_cast<size_t>(FinishClass::kStep)], 1u);
  EXPECT_EQ(grpc.prompt_tokens, 4u);
  EXPECT_EQ(grpc.generation_tokens, 1u);
  EXPECT_EQ(grpc.ttft.count, 1u);
  EXPECT_EQ(grpc.inter_token.count, 0u);

  const auto& http = of(m, Transport::kHttp);
  EXPECT_EQ(http.failure[static_cast<size_t>(ErrorCode::kInvalidArgument)], 1u);
  EXPECT_EQ(http.generation_tokens, 0u);
  EXPECT_EQ(http.e2e.count, 0u);
  for (const auto& t : m.transports) {
    EXPECT_EQ(t.running, 0);
    EXPECT_EQ(t.waiting, 0);
  }
  EXPECT_EQ(s.stats().slots_held, 1u) << "the step's session is open; the temporary ones are closed";
}

TEST(ServiceMetrics, AbortAndRunningGauge) {
  ServiceLimits limits = test_limits();
  limits.max_batch_tokens = 4;  // the 200-token prompt takes 50 ticks: the abort lands before the first token
  ServiceFixture f = ServiceFixture::make("golden-qwen35moe", limits);
  ASSERT_TRUE(f.service);
  Service& s = *f.service;
  auto session = s.create_session(SessionOptions{});
  ASSERT_TRUE(session);
  GenerateRequest g = gen_request(session->id, iota_tokens(200), 10);
  g.transport = Transport::kHttp;
  auto sink = std::make_shared<test::RecordingSink>();
  s.generate(g, sink);
  // While it runs it is counted as running (or, before its first tick, waiting).
  const ServiceMetrics::Snapshot during = s.metrics().snapshot();
  EXPECT_EQ(of(during, Transport::kHttp).running + of(during, Transport::kHttp).waiting, 1);
  ASSERT_TRUE(s.abort(session->id));
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kAborted);
  const ServiceMetrics::Snapshot after = s.metrics().snapshot();
  EXPECT_EQ(of(after, Transport::kHttp).success[static_cast<size_t>(FinishClass::kAbort)], 1u);
  EXPECT_EQ(of(after, Transport::kHttp).running, 0);
  EXPECT_EQ(of(after, Transport::kHttp).waiting, 0);
}

}  // namespace
}  // namespace kestrel::daemon
