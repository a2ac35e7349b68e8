// Service admission: every limit and every bad input gets its ErrorCode before anything is queued; idle TTL
// expiry; close_owned_by; random session ids; make_service's own checks; the tick budget rule.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "daemon/engine/scheduler.h"
#include "tests/daemon/engine/engine_test_util.h"

namespace kestrel::daemon {
namespace {

using test::gen_request;
using test::generate_sync;
using test::iota_tokens;
using test::RecordingSink;
using test::ServiceFixture;
using test::step_sync;
using test::step_tokens;
using test::test_limits;

constexpr const char* kModel = "golden-qwen35";

bool message_has(const Error& e, const std::string& part) { return e.message.find(part) != std::string::npos; }

TEST(ServiceAdmission, MaxSessionsAndRandomIds) {
  ServiceLimits limits = test_limits();
  limits.max_sessions = 3;
  auto f = ServiceFixture::make(kModel, limits);
  ASSERT_TRUE(f.service);
  std::vector<SessionId> ids;
  for (int i = 0; i < 3; ++i) {
    auto s = f.service->create_session({});
    ASSERT_TRUE(s);
    EXPECT_NE(s->id, 0u);
    ids.push_back(s->id);
  }
  auto full = f.service->create_session({});
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(message_has(full.error(), "max_sessions")) << full.error().message;
  EXPECT_EQ(f.service->clone_session(ids[0], 0).error().code, ErrorCode::kResourceExhausted);
  auto tmp = generate_sync(*f.service, gen_request(0, {1, 2}, 2));
  EXPECT_EQ(tmp->result().error().code, ErrorCode::kResourceExhausted) << "temporary sessions count too";
  // Not sequential: no two ids a small distance apart.
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t j = i + 1; j < ids.size(); ++j) {
      const uint64_t d = ids[i] > ids[j] ? ids[i] - ids[j] : ids[j] - ids[i];
      EXPECT_GT(d, 1000u);
    }
  }
  EXPECT_TRUE(f.service->close_session(ids[1]));
  EXPECT_TRUE(f.service->create_session({}).has_value());
  EXPECT_EQ(f.service->stats().sessions, 3u);
}

TEST(ServiceAdmission, BadInputIsRejectedBeforeQueueing) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  auto sess = f.service->create_session({});
  ASSERT_TRUE(sess);
  const auto n_vocab = static_cast<int32_t>(f.model->hparams().n_vocab);
  auto code_of = [&](StepRequest r) {
    auto res = step_sync(*f.service, std::move(r));
    return res ? ErrorCode::kInternal : res.error().code;
  };
  StepRequest r;
  r.session = sess->id;
  r.tokens = {1, n_vocab};
  EXPECT_EQ(code_of(r), ErrorCode::kInvalidArgument);
  r.tokens = {-1};
  EXPECT_EQ(code_of(r), ErrorCode::kInvalidArgument);
  r.tokens = {};
  EXPECT_EQ(code_of(r), ErrorCode::kInvalidArgument);
  r.tokens = {1};
  r.top_logprobs = 21;
  EXPECT_EQ(code_of(r), ErrorCode::kInvalidArgument);
  r.top_logprobs = -1;
  EXPECT_EQ(code_of(r), ErrorCode::kInvalidArgument);
  r.top_logprobs = 0;
  r.sampling.temperature = -1.0f;
  EXPECT_EQ(code_of(r), ErrorCode::kInvalidArgument);
  r.sampling.temperature.reset();
  r.sampling.top_p = 0.0f;
  EXPECT_EQ(code_of(r), ErrorCode::kInvalidArgument);
  r.sampling.top_p.reset();
  r.session = 424242;
  EXPECT_EQ(code_of(r), ErrorCode::kNotFound);
  r.session = sess->id;
  r.tokens = iota_tokens(257);  // default_n_ctx is 256
  EXPECT_EQ(code_of(r), ErrorCode::kOutOfRange);

  GenerateRequest g = gen_request(sess->id, {1, 2}, 0);
  EXPECT_EQ(generate_sync(*f.service, g)->result().error().code, ErrorCode::kInvalidArgument);  // max_tokens 0
  g.max_tokens = 4;
  g.prompt = {};
  EXPECT_EQ(generate_sync(*f.service, g)->result().error().code, ErrorCode::kInvalidArgument);
  g.prompt = {n_vocab + 5};
  EXPECT_EQ(generate_sync(*f.service, g)->result().error().code, ErrorCode::kInvalidArgument);
  g.prompt = {1};
  g.top_logprobs = 30;
  EXPECT_EQ(generate_sync(*f.service, g)->result().error().code, ErrorCode::kInvalidArgument);
  g.top_logprobs = 0;
  g.sampling.min_p = 2.0f;
  EXPECT_EQ(generate_sync(*f.service, g)->result().error().code, ErrorCode::kInvalidArgument);
  g.session = 0;  // the temporary session is not left behind
  EXPECT_EQ(generate_sync(*f.service, g)->result().error().code, ErrorCode::kInvalidArgument);

  // Nothing was queued or consumed.
  const ServiceStats st = f.service->stats();
  EXPECT_EQ(st.queued_steps, 0u);
  EXPECT_EQ(st.tokens_processed, 0u);
  EXPECT_EQ(st.sessions, 1u);
  auto ok = step_tokens(*f.service, sess->id, {1});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->n_past, 1);

  // Session options.
  SessionOptions o;
  o.n_ctx = 513;  // max_session_ctx is 512
  auto big = f.service->create_session(o);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(message_has(big.error(), "512")) << big.error().message;
  o.n_ctx = -1;
  EXPECT_EQ(f.service->create_session(o).error().code, ErrorCode::kInvalidArgument);
  o.n_ctx = 0;
  o.sampling.top_k = -3;
  EXPECT_EQ(f.service->create_session(o).error().code, ErrorCode::kInvalidArgument);
  o.sampling.top_k.reset();
  o.idle_ttl = std::chrono::seconds(86401);
  EXPECT_EQ(f.service->create_session(o).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(f.service->stats().sessions, 1u);
}

TEST(ServiceAdmission, BusySessionAndQueueLimit) {
  ServiceLimits limits = test_limits();
  limits.max_queued_steps = 1;
  limits.max_batch_tokens = 1;
  auto f = ServiceFixture::make(kModel, limits);
  ASSERT_TRUE(f.service);
  auto a = f.service->create_session({});
  auto b = f.service->create_session({});
  ASSERT_TRUE(a && b);
  StepRequest slow;
  slow.session = a->id;
  slow.tokens = iota_tokens(40);  // 40 ticks
  auto p = std::make_shared<std::promise<Expected<StepResult>>>();
  auto fut = p->get_future();
  f.service->step(slow, [p](Expected<StepResult> r) { p->set_value(std::move(r)); });

  auto busy = step_tokens(*f.service, a->id, {1});
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(f.service->clone_session(a->id, 0).error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(f.service->reset_session(a->id).error().code, ErrorCode::kFailedPrecondition);
  auto queued = step_tokens(*f.service, b->id, {1});
  ASSERT_FALSE(queued);
  EXPECT_EQ(queued.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(message_has(queued.error(), "max_queued_steps")) << queued.error().message;
  auto gen = generate_sync(*f.service, gen_request(b->id, {1}, 2));
  EXPECT_EQ(gen->result().error().code, ErrorCode::kResourceExhausted);

  auto r = fut.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->n_past, 40);
  EXPECT_TRUE(step_tokens(*f.service, b->id, {1}).has_value());
}

TEST(ServiceAdmission, IdleSessionsExpire) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  SessionOptions short_ttl;
  short_ttl.idle_ttl = std::chrono::seconds(1);
  auto a = f.service->create_session(short_ttl);
  auto b = f.service->create_session({});  // default TTL (600 s)
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(step_tokens(*f.service, a->id, {1, 2}));
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  EXPECT_EQ(step_tokens(*f.service, a->id, {3}).error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(step_tokens(*f.service, b->id, {3}).has_value());
  EXPECT_EQ(f.service->stats().sessions, 1u);
}

TEST(ServiceAdmission, CloseOwnedBy) {
  // Contexts of 8192 tokens: the generations below must still be running when close_owned_by comes however the
  // threads are scheduled (a 256-token context filled in ~0.3 s on this model, and a busy machine once let one end
  // with kContextFull first).
  ServiceLimits limits = test_limits();
  limits.default_n_ctx = 8192;
  limits.max_session_ctx = 8192;
  auto f = ServiceFixture::make(kModel, limits);
  ASSERT_TRUE(f.service);
  SessionOptions mine;
  mine.owner = 7;
  SessionOptions other;
  other.owner = 8;
  auto a = f.service->create_session(mine);
  auto b = f.service->create_session(mine);
  auto c = f.service->create_session(other);
  ASSERT_TRUE(a && b && c);
  auto d = f.service->clone_session(c->id, 7);  // a clone takes the owner it is given
  ASSERT_TRUE(d);
  GenerateRequest g = gen_request(a->id, {1, 2, 3}, 100000);
  g.ignore_eos = true;
  auto sink = std::make_shared<RecordingSink>();
  f.service->generate(g, sink);
  GenerateRequest tmp = gen_request(0, {4}, 100000);
  tmp.ignore_eos = true;
  tmp.owner = 7;
  auto tmp_sink = std::make_shared<RecordingSink>();
  f.service->generate(tmp, tmp_sink);
  EXPECT_EQ(f.service->close_owned_by(7), 4u);  // a, b, d and the temporary session
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(tmp_sink->wait());
  EXPECT_EQ(sink->result()->reason, FinishReason::kAborted);
  EXPECT_EQ(tmp_sink->result()->reason, FinishReason::kAborted);
  EXPECT_EQ(f.service->close_owned_by(7), 0u);
  EXPECT_EQ(f.service->stats().sessions, 1u);
  EXPECT_TRUE(step_tokens(*f.service, c->id, {1}).has_value());
}

TEST(ServiceAdmission, MakeServiceChecksLimits) {
  auto model = test::open_fixture(kModel);
  ASSERT_TRUE(model);
  auto engine = make_reference_engine(*model, 2);
  ASSERT_TRUE(engine);
  ServiceLimits l = test_limits();
  l.max_batch_tokens = 0;
  EXPECT_EQ(make_service(*model, **engine, l).error().code, ErrorCode::kInvalidArgument);
  l = test_limits();
  l.default_sampling.temperature = -2.0f;
  EXPECT_EQ(make_service(*model, **engine, l).error().code, ErrorCode::kInvalidArgument);
  l = test_limits();
  l.max_session_ctx = 1 << 30;  // clamped to the training context
  auto s = make_service(*model, **engine, l);
  ASSERT_TRUE(s);
  EXPECT_EQ((*s)->limits().max_session_ctx, static_cast<int32_t>(model->hparams().n_ctx_train));
  EXPECT_EQ((*s)->model_info().max_session_ctx, static_cast<int32_t>(model->hparams().n_ctx_train));
  EXPECT_STREQ(finish_reason_name(FinishReason::kStopString), "stop string");
}

TEST(TickBudget, WaterFillingAndRotation) {
  // Decodes are met in full; prefills share the rest evenly.
  EXPECT_EQ(allocate_tick_tokens({1, 100, 1, 100}, 20, 0), (std::vector<size_t>{1, 9, 1, 9}));
  EXPECT_EQ(allocate_tick_tokens({3, 100}, 20, 0), (std::vector<size_t>{3, 17}));
  EXPECT_EQ(allocate_tick_tokens({5, 5}, 100, 0), (std::vector<size_t>{5, 5}));
  // More requests than tokens: the rotation picks who goes first.
  EXPECT_EQ(allocate_tick_tokens({1, 1, 1}, 2, 0), (std::vector<size_t>{1, 1, 0}));
  EXPECT_EQ(allocate_tick_tokens({1, 1, 1}, 2, 1), (std::vector<size_t>{0, 1, 1}));
  EXPECT_EQ(allocate_tick_tokens({1, 1, 1}, 2, 2), (std::vector<size_t>{1, 0, 1}));
  EXPECT_EQ(allocate_tick_tokens({}, 8, 3), std::vector<size_t>{});
  EXPECT_EQ(allocate_tick_tokens({0, 7}, 8, 0), (std::vector<size_t>{0, 7}));
}

}  // namespace
}  // namespace kestrel::daemon
