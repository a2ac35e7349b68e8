// Many clients at once: 8 threads drive their own sessions through steps and generations concurrently; every
// thread gets exactly the tokens it gets when it runs alone (batch-composition independence), and the engine loop
// really batched them (fewer ticks than tokens fed).
#include <gtest/gtest.h>

#include <thread>

#include "tests/daemon/engine/engine_test_util.h"

namespace kestrel::daemon {
namespace {

using test::gen_request;
using test::generate_sync;
using test::iota_tokens;
using test::ServiceFixture;
using test::step_sync;
using test::test_limits;

// One client's script: a prompt step, a generation of 4 tokens, then another step. Returns every token it saw.
std::vector<int32_t> run_client(Service& s, int i) {
  std::vector<int32_t> seen;
  SessionOptions o;
  o.sampling.temperature = 0.9f;
  o.sampling.top_k = 30;
  o.sampling.seed = 1000 + static_cast<uint64_t>(i);
  auto sess = s.create_session(o);
  EXPECT_TRUE(sess.has_value());
  if (!sess) return seen;
  StepRequest r;
  r.session = sess->id;
  r.tokens = iota_tokens(5 + 2 * i, 5 + i, 11);
  auto a = step_sync(s, r);
  EXPECT_TRUE(a.has_value());
  seen.push_back(a ? a->token : -1);
  GenerateRequest g = gen_request(sess->id, {a ? a->token : 1}, 4);
  g.ignore_eos = true;
  auto sink = generate_sync(s, g);
  EXPECT_TRUE(sink->result().has_value());
  for (int32_t t : sink->tokens()) seen.push_back(t);
  r.tokens = {static_cast<int32_t>(7 + i)};
  r.sampling.temperature = 0.0f;  // a greedy override for this request only
  auto b = step_sync(s, r);
  EXPECT_TRUE(b.has_value());
  seen.push_back(b ? b->token : -1);
  seen.push_back(b ? static_cast<int32_t>(b->n_past) : -1);
  EXPECT_TRUE(s.close_session(sess->id));
  return seen;
}

TEST(ServiceConcurrency, EightThreadsGetTheTokensTheyGetAlone) {
  constexpr int kThreads = 8;
  ServiceLimits limits = test_limits();
  limits.max_batch_tokens = 8;  // prefills of different clients share ticks in chunks
  auto f = ServiceFixture::make("golden-qwen35", limits);
  ASSERT_TRUE(f.service);

  std::vector<std::vector<int32_t>> alone(kThreads);
  for (int i = 0; i < kThreads; ++i) alone[i] = run_client(*f.service, i);
  const uint64_t ticks_alone = f.service->stats().ticks;

  std::vector<std::vector<int32_t>> together(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { together[i] = run_client(*f.service, i); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(together[i], alone[i]) << "client " << i;

  const ServiceStats st = f.service->stats();
  EXPECT_EQ(st.sessions, 0u);
  EXPECT_EQ(st.queued_steps, 0u);
  EXPECT_EQ(st.tokens_generated, 2u * kThreads * 4);
  EXPECT_LE(st.ticks - ticks_alone, ticks_alone) << "concurrent clients share ticks";
}

}  // namespace
}  // namespace kestrel::daemon
