// Service::generate: tokens equal a direct ref::forward + Sampler loop; pending-token semantics; every finish
// reason (max tokens, stop token, stop string, context full, aborted); abort of a step; sink cancellation closes a
// temporary session; deadlines; close_session and drain while generations run.
#include <gtest/gtest.h>

#include <thread>

#include "core/sampler/sampler.h"
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

constexpr const char* kModel = "golden-qwen35moe";

// Direct reference: prefill `prompt`, then sample / feed n tokens (the last one is not fed).
std::vector<int32_t> direct_generate(const Model& m, const SamplingParams& p, const std::vector<int32_t>& prompt,
                                     int n) {
  kestrel::test::RefSession direct(m, 512);
  auto sampler = Sampler::create(p, static_cast<int32_t>(m.hparams().n_vocab));
  ref::ForwardOutput out = direct.feed(prompt);
  std::vector<int32_t> history = prompt;  // the tokens fed, the sampler's penalty window
  std::vector<int32_t> gen;
  for (int i = 0; i < n; ++i) {
    const int32_t t = *sampler->sample_checked(out.logits, history, nullptr);
    gen.push_back(t);
    if (i + 1 < n) {
      const int32_t one[1] = {t};
      out = direct.feed(one);
      history.push_back(t);
    }
  }
  return gen;
}

TEST(ServiceGenerate, MaxTokensMatchesDirectAndPendingTokenIsFedNext) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  const std::vector<int32_t> prompt = iota_tokens(17);
  const SamplingParams greedy = test_limits().default_sampling;
  const std::vector<int32_t> expect = direct_generate(*f.model, greedy, prompt, 10);

  auto sess = f.service->create_session({});
  ASSERT_TRUE(sess);
  auto sink = generate_sync(*f.service, gen_request(sess->id, prompt, 10));
  ASSERT_TRUE(sink->result().has_value()) << sink->result().error().to_string();
  EXPECT_EQ(sink->tokens(), expect);
  const GenerateSummary& sum = *sink->result();
  EXPECT_EQ(sum.reason, FinishReason::kMaxTokens);
  EXPECT_EQ(sum.prompt_tokens, 17u);
  EXPECT_EQ(sum.completion_tokens, 10u);
  EXPECT_EQ(sum.session, sess->id);
  EXPECT_EQ(sum.n_past, 27);  // the last token counts, though it is not fed yet
  EXPECT_EQ(sink->chunks().back().n_past, 27);
  std::string text = *f.service->detokenize(expect, SIZE_MAX);
  EXPECT_EQ(sink->text(), text);

  // The next step feeds the pending token first: same as a direct run over prompt + generated + {5}.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), expect.begin(), expect.end());
  all.push_back(5);
  const std::vector<int32_t> next = direct_generate(*f.model, greedy, all, 1);
  auto r = step_tokens(*f.service, sess->id, {5});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->token, next[0]);
  EXPECT_EQ(r->n_past, 28);

  // A generation continues after a generation the same way (its pending token goes in front of the prompt).
  auto g2 = generate_sync(*f.service, gen_request(sess->id, {6}, 3));
  ASSERT_TRUE(g2->result());
  all.push_back(6);
  EXPECT_EQ(g2->tokens(), direct_generate(*f.model, greedy, all, 3));
  EXPECT_EQ(g2->result()->n_past, 28 + 1 + 3);
}

TEST(ServiceGenerate, SeededSamplingMatchesDirectAndTopLogprobs) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  SamplingParams p = test_limits().default_sampling;
  p.temperature = 1.1f;
  p.top_k = 50;
  p.min_p = 0.01f;
  p.repetition_penalty = 1.2f;
  p.seed = 4242;
  GenerateRequest req = gen_request(0, iota_tokens(9, 3), 12);
  req.sampling.temperature = p.temperature;
  req.sampling.top_k = p.top_k;
  req.sampling.min_p = p.min_p;
  req.sampling.repetition_penalty = p.repetition_penalty;
  req.sampling.seed = p.seed;
  req.top_logprobs = 3;
  req.ignore_eos = true;
  auto sink = generate_sync(*f.service, req);
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->tokens(), direct_generate(*f.model, p, req.prompt, 12));
  EXPECT_EQ(sink->result()->session, 0u) << "a temporary session is not reported";
  for (const GenerateChunk& c : sink->chunks()) {
    if (c.tokens.empty()) continue;
    ASSERT_EQ(c.logprobs.size(), 1u);
    EXPECT_EQ(c.logprobs[0].token, c.tokens[0]);
    EXPECT_EQ(c.logprobs[0].top.size(), 3u);
  }
  EXPECT_EQ(f.service->stats().sessions, 0u) << "the temporary session is closed";
}

TEST(ServiceGenerate, StopTokenAndStopString) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  const std::vector<int32_t> prompt = iota_tokens(11, 40);
  const std::vector<int32_t> full = direct_generate(*f.model, test_limits().default_sampling, prompt, 16);
  // Stop token: the first generated token that did not occur before it.
  size_t k = 3;
  while (k < full.size() && std::find(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k), full[k]) !=
                                full.begin() + static_cast<std::ptrdiff_t>(k)) {
    ++k;
  }
  ASSERT_LT(k, full.size()) << "greedy output repeats itself; pick another prompt";
  GenerateRequest req = gen_request(0, prompt, 16);
  req.stop_tokens = {full[k]};
  auto sink = generate_sync(*f.service, req);
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kStopToken);
  EXPECT_EQ(sink->tokens(), std::vector<int32_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k) + 1));
  const std::string before = *f.service->detokenize(
      std::vector<int32_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k)), SIZE_MAX);
  EXPECT_EQ(sink->text(), before) << "the stop token's own text is not emitted";

  // Stop string: the text of generated tokens 4..5, cut before its first occurrence.
  const std::string full_text = *f.service->detokenize(full, SIZE_MAX);
  const std::string stop = *f.service->detokenize({full[4], full[5]}, SIZE_MAX);
  ASSERT_FALSE(stop.empty());
  GenerateRequest req2 = gen_request(0, prompt, 16);
  req2.stop_strings = {stop};
  auto sink2 = generate_sync(*f.service, req2);
  ASSERT_TRUE(sink2->result());
  EXPECT_EQ(sink2->result()->reason, FinishReason::kStopString);
  EXPECT_EQ(sink2->text(), full_text.substr(0, full_text.find(stop)));
  EXPECT_LE(sink2->tokens().size(), 6u);
}

TEST(ServiceGenerate, ContextFullAndOverflow) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  const std::vector<int32_t> prompt = iota_tokens(10);
  GenerateRequest req = gen_request(0, prompt, 100);
  req.n_ctx = 13;
  auto sink = generate_sync(*f.service, req);
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kContextFull);
  EXPECT_EQ(sink->tokens(), direct_generate(*f.model, test_limits().default_sampling, prompt, 3));
  EXPECT_EQ(sink->result()->n_past, 13);
  req.n_ctx = 9;
  auto over = generate_sync(*f.service, req);
  ASSERT_FALSE(over->result());
  EXPECT_EQ(over->result().error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(f.service->stats().sessions, 0u);
}

TEST(ServiceGenerate, AbortOfAGenerationAndOfAStep) {
  ServiceLimits limits = test_limits();
  limits.max_batch_tokens = 4;
  auto f = ServiceFixture::make(kModel, limits);
  ASSERT_TRUE(f.service);
  auto sess = f.service->create_session({});
  ASSERT_TRUE(sess);
  GenerateRequest req = gen_request(sess->id, iota_tokens(5), 400);
  req.ignore_eos = true;
  auto sink = std::make_shared<RecordingSink>();
  f.service->generate(req, sink);
  while (sink->n_chunks() < 2 && !sink->done()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(*f.service->abort(sess->id), true);
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kAborted);
  EXPECT_LT(sink->result()->completion_tokens, 400u);
  EXPECT_EQ(sink->result()->n_past, 5 + static_cast<int64_t>(sink->result()->completion_tokens));
  EXPECT_EQ(*f.service->abort(sess->id), false) << "nothing in flight any more";

  // A step of 200 tokens at 4 per tick, aborted at once.
  StepRequest sreq;
  sreq.session = sess->id;
  sreq.tokens = iota_tokens(200);
  auto p = std::make_shared<std::promise<Expected<StepResult>>>();
  auto fut = p->get_future();
  const int64_t before = sink->result()->n_past;
  f.service->step(sreq, [p](Expected<StepResult> r) { p->set_value(std::move(r)); });
  EXPECT_EQ(*f.service->abort(sess->id), true);
  auto r = fut.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kCancelled);
  // The session keeps what was consumed and stays usable.
  auto next = step_tokens(*f.service, sess->id, {1});
  ASSERT_TRUE(next) << next.error().to_string();
  EXPECT_GE(next->n_past, before + 1);
  EXPECT_LE(next->n_past, before + 201);
  EXPECT_EQ(f.service->abort(777).error().code, ErrorCode::kNotFound);
}

// Cancels itself after the first chunk, as a transport does when its peer goes away.
class CancellingSink : public RecordingSink {
 public:
  void on_chunk(GenerateChunk chunk) override {
    RecordingSink::on_chunk(std::move(chunk));
    cancel();
  }
};

TEST(ServiceGenerate, SinkCancellationEndsAndClosesTemporarySession) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  GenerateRequest req = gen_request(0, iota_tokens(6), 200);
  req.ignore_eos = true;
  auto sink = std::make_shared<CancellingSink>();
  f.service->generate(req, sink);
  ASSERT_TRUE(sink->wait());
  ASSERT_FALSE(sink->result());
  EXPECT_EQ(sink->result().error().code, ErrorCode::kCancelled);
  EXPECT_EQ(sink->n_chunks(), 1u) << "no chunk after the sink reports cancelled";
  EXPECT_EQ(f.service->stats().sessions, 0u);
  EXPECT_EQ(f.service->stats().queued_steps, 0u);
}

TEST(ServiceGenerate, Deadlines) {
  ServiceLimits limits = test_limits();
  limits.max_batch_tokens = 4;
  auto f = ServiceFixture::make(kModel, limits);
  ASSERT_TRUE(f.service);
  auto sess = f.service->create_session({});
  ASSERT_TRUE(sess);
  StepRequest sreq;
  sreq.session = sess->id;
  sreq.tokens = iota_tokens(8);
  sreq.deadline = Clock::now() - std::chrono::milliseconds(1);
  auto r = step_sync(*f.service, sreq);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kDeadlineExceeded);

  GenerateRequest req = gen_request(sess->id, iota_tokens(3), 100000);
  req.ignore_eos = true;
  req.deadline = Clock::now() + std::chrono::milliseconds(200);
  auto sink = generate_sync(*f.service, req);
  ASSERT_FALSE(sink->result());
  EXPECT_EQ(sink->result().error().code, ErrorCode::kDeadlineExceeded);
  // The session keeps the tokens consumed before the deadline: the prompt (unless the deadline came first) and
  // every generated token (the last one pending).
  const int64_t generated = static_cast<int64_t>(sink->tokens().size());
  auto next = step_tokens(*f.service, sess->id, {2});
  ASSERT_TRUE(next);
  if (generated > 0) {
    EXPECT_EQ(next->n_past, 3 + generated + 1);
  } else {
    EXPECT_TRUE(next->n_past == 1 || next->n_past == 4) << next->n_past;
  }
}

TEST(ServiceGenerate, CloseSessionAbortsItsGeneration) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  auto sess = f.service->create_session({});
  ASSERT_TRUE(sess);
  GenerateRequest req = gen_request(sess->id, iota_tokens(4), 400);
  req.ignore_eos = true;
  auto sink = std::make_shared<RecordingSink>();
  f.service->generate(req, sink);
  while (sink->n_chunks() < 1 && !sink->done()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(f.service->close_session(sess->id));
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kAborted);
  EXPECT_EQ(step_tokens(*f.service, sess->id, {1}).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(f.service->close_session(sess->id).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(f.service->stats().sessions, 0u);
}

TEST(ServiceGenerate, DrainFinishesInFlightThenRefuses) {
  auto f = ServiceFixture::make(kModel, test_limits());
  ASSERT_TRUE(f.service);
  auto sess = f.service->create_session({});
  ASSERT_TRUE(sess);
  GenerateRequest req = gen_request(sess->id, iota_tokens(4), 20);
  req.ignore_eos = true;
  auto sink = std::make_shared<RecordingSink>();
  f.service->generate(req, sink);
  f.service->drain(Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(sink->done());
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kMaxTokens);
  EXPECT_EQ(sink->result()->completion_tokens, 20u);
  EXPECT_FALSE(f.service->stats().serving);
  EXPECT_EQ(step_tokens(*f.service, sess->id, {1}).error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(f.service->create_session({}).error().code, ErrorCode::kUnavailable);
  f.service->drain(Clock::now());  // a second drain returns at once
}

// What the drain deadline cuts ends with its own reason and message, unlike a user's Abort: a Generate with
// FinishReason::kShutdown, a Step with UNAVAILABLE; both name the drain time.
TEST(ServiceGenerate, DrainDeadlineEndsWhatIsLeftWithShutdown) {
  ServiceLimits limits = test_limits();
  limits.max_batch_tokens = 4;
  auto f = ServiceFixture::make(kModel, limits);
  ASSERT_TRUE(f.service);
  auto a = f.service->create_session({});
  auto b = f.service->create_session({});
  ASSERT_TRUE(a && b);
  GenerateRequest req = gen_request(a->id, iota_tokens(4), 100000);
  req.ignore_eos = true;
  auto sink = std::make_shared<RecordingSink>();
  f.service->generate(req, sink);
  StepRequest sreq;
  sreq.session = b->id;
  sreq.tokens = iota_tokens(200);
  auto p = std::make_shared<std::promise<Expected<StepResult>>>();
  auto fut = p->get_future();
  f.service->step(sreq, [p](Expected<StepResult> r) { p->set_value(std::move(r)); });
  f.service->drain(Clock::now() + std::chrono::milliseconds(100));
  ASSERT_TRUE(sink->done());
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kShutdown);
  EXPECT_EQ(sink->result()->message,
            "kestreld is shutting down: its drain time of 0.1 s ran out before this generation finished");
  auto r = fut.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(r.error().message,
            "kestreld is shutting down: its drain time of 0.1 s ran out before this step finished; retry on another "
            "kestreld");
  // The metrics count the cut generation as vLLM's "abort" (ended by the server), the cut step as UNAVAILABLE.
  const ServiceMetrics::Snapshot m = f.service->metrics().snapshot();
  const auto& grpc = m.transports[static_cast<size_t>(Transport::kGrpc)];
  EXPECT_EQ(grpc.success[static_cast<size_t>(FinishClass::kAbort)], 1u);
  EXPECT_EQ(grpc.failure[static_cast<size_t>(ErrorCode::kUnavailable)], 1u);
}

TEST(ServiceGenerate, DestructorDrainsImmediately) {
  auto sink = std::make_shared<RecordingSink>();
  {
    auto f = ServiceFixture::make(kModel, test_limits());
    ASSERT_TRUE(f.service);
    GenerateRequest req = gen_request(0, iota_tokens(4), 100000);
    req.ignore_eos = true;
    f.service->generate(req, sink);
    f.service.reset();
    ASSERT_TRUE(sink->done());
  }
  ASSERT_TRUE(sink->result());
  EXPECT_EQ(sink->result()->reason, FinishReason::kShutdown);
  EXPECT_EQ(sink->result()->message,
            "kestreld is stopping without a drain period: this generation was cut before it finished");
}

}  // namespace
}  // namespace kestrel::daemon
