// Service steps: results equal ref::forward + Sampler run directly (greedy and seeded), per-request overrides,
// clone continues identically, reset, top logprobs, prefill split across ticks, model info and stats.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "core/sampler/sampler.h"
#include "tests/daemon/engine/engine_test_util.h"

namespace kestrel::daemon {
namespace {

using test::iota_tokens;
using test::ServiceFixture;
using test::step_sync;
using test::step_tokens;
using test::test_limits;

// Runs the same steps directly on ref::forward + one Sampler: each step's tokens, then one sampled token.
std::vector<StepResult> direct_steps(const Model& m, const SamplingParams& params,
                                     const std::vector<std::vector<int32_t>>& steps, int n_ctx) {
  kestrel::test::RefSession direct(m, n_ctx);
  auto sampler = Sampler::create(params, static_cast<int32_t>(m.hparams().n_vocab));
  EXPECT_TRUE(sampler);
  std::vector<StepResult> out;
  std::vector<int32_t> history;  // the tokens fed, the sampler's penalty window
  for (const auto& toks : steps) {
    const ref::ForwardOutput fwd = direct.feed(toks);
    history.insert(history.end(), toks.begin(), toks.end());
    SampleResult sr;
    auto t = sampler->sample_checked(fwd.logits, history, &sr);
    EXPECT_TRUE(t.has_value());
    out.push_back(StepResult{*t, sr.logprob, sr.top, direct.n_past()});
  }
  return out;
}

class ServiceStepTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ServiceStepTest, GreedyAndSeededStepsEqualDirectReference) {
  ServiceLimits limits = test_limits();
  limits.max_batch_tokens = 7;  // the 20-token prompt runs as several prefill chunks
  auto f = ServiceFixture::make(GetParam(), limits);
  ASSERT_TRUE(f.service);
  const std::vector<std::vector<int32_t>> steps = {iota_tokens(20), {5}, {77, 78}, {900}};

  for (const bool seeded : {false, true}) {
    SamplingParams params = limits.default_sampling;
    SessionOptions opts;
    if (seeded) {
      params.temperature = 0.9f;
      params.top_k = 40;
      params.top_p = 0.95f;
      params.seed = 1234;
      opts.sampling.temperature = 0.9f;
      opts.sampling.top_k = 40;
      opts.sampling.top_p = 0.95f;
      opts.sampling.seed = 1234;
    }
    const auto expect = direct_steps(*f.model, params, steps, 256);
    auto sess = f.service->create_session(opts);
    ASSERT_TRUE(sess.has_value()) << sess.error().to_string();
    EXPECT_NE(sess->id, 0u);
    for (size_t i = 0; i < steps.size(); ++i) {
      auto r = step_tokens(*f.service, sess->id, steps[i]);
      ASSERT_TRUE(r.has_value()) << r.error().to_string();
      EXPECT_EQ(r->token, expect[i].token) << "seeded=" << seeded << " step " << i;
      EXPECT_EQ(r->n_past, expect[i].n_past);
    }
    EXPECT_TRUE(f.service->close_session(sess->id));
  }
  const ServiceStats st = f.service->stats();
  EXPECT_TRUE(st.serving);
  EXPECT_EQ(st.sessions, 0u);
  EXPECT_EQ(st.tokens_processed, 2u * (20 + 1 + 2 + 1));
  EXPECT_GE(st.ticks, 2u * (3 + 3));  // ceil(20 / 7) prefill ticks + 3 single ticks per pass
}

TEST_P(ServiceStepTest, OverridesApplyToOneRequestAndLogprobsMatch) {
  auto f = ServiceFixture::make(GetParam(), test_limits());
  ASSERT_TRUE(f.service);
  SamplingParams seeded = test_limits().default_sampling;
  seeded.temperature = 1.0f;
  seeded.seed = 99;
  // Session greedy; request 2 overrides temperature and seed; request 3 is greedy again with logprobs.
  const std::vector<std::vector<int32_t>> steps = {iota_tokens(8), {3}, {4}};
  auto sess = f.service->create_session({});
  ASSERT_TRUE(sess);
  auto r1 = step_tokens(*f.service, sess->id, steps[0]);
  StepRequest req2;
  req2.session = sess->id;
  req2.tokens = steps[1];
  req2.sampling.temperature = 1.0f;
  req2.sampling.seed = 99;
  auto r2 = step_sync(*f.service, req2);
  StepRequest req3;
  req3.session = sess->id;
  req3.tokens = steps[2];
  req3.top_logprobs = 5;
  auto r3 = step_sync(*f.service, req3);
  ASSERT_TRUE(r1 && r2 && r3);

  // Direct: greedy, then a sampler seeded 99 at temperature 1, then greedy with 5 logprobs.
  kestrel::test::RefSession direct(*f.model, 256);
  const auto n_vocab = static_cast<int32_t>(f.model->hparams().n_vocab);
  std::vector<int32_t> history(steps[0].begin(), steps[0].end());  // the tokens fed
  ref::ForwardOutput out = direct.feed(steps[0]);
  ASSERT_FALSE(out.logits.empty());
  auto greedy = Sampler::create(test_limits().default_sampling, n_vocab);
  EXPECT_EQ(r1->token, *greedy->sample_checked(out.logits, history, nullptr));
  out = direct.feed(steps[1]);
  ASSERT_FALSE(out.logits.empty());
  history.insert(history.end(), steps[1].begin(), steps[1].end());
  auto hot = Sampler::create(seeded, n_vocab);
  EXPECT_EQ(r2->token, *hot->sample_checked(out.logits, history, nullptr));
  out = direct.feed(steps[2]);
  ASSERT_FALSE(out.logits.empty());
  history.insert(history.end(), steps[2].begin(), steps[2].end());
  SamplingParams lp = test_limits().default_sampling;
  lp.n_logprobs = 5;
  auto with_lp = Sampler::create(lp, n_vocab);
  SampleResult sr;
  EXPECT_EQ(r3->token, *with_lp->sample_checked(out.logits, history, &sr));
  ASSERT_EQ(r3->top.size(), 5u);
  EXPECT_EQ(r3->logprob, sr.logprob);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(r3->top[i].id, sr.top[i].id);
    EXPECT_EQ(r3->top[i].logprob, sr.top[i].logprob);
  }
  EXPECT_TRUE(r1->top.empty());
}

TEST_P(ServiceStepTest, CloneContinuesIdenticallyAndResetStartsOver) {
  auto f = ServiceFixture::make(GetParam(), test_limits());
  ASSERT_TRUE(f.service);
  SessionOptions opts;
  opts.sampling.temperature = 0.8f;
  opts.sampling.seed = 7;
  auto a = f.service->create_session(opts);
  ASSERT_TRUE(a);
  ASSERT_TRUE(step_tokens(*f.service, a->id, iota_tokens(12)));
  auto b = f.service->clone_session(a->id, 0);
  ASSERT_TRUE(b) << b.error().to_string();
  EXPECT_NE(b->id, a->id);
  EXPECT_EQ(b->n_past, 12);
  for (int i = 0; i < 4; ++i) {
    auto ra = step_tokens(*f.service, a->id, {static_cast<int32_t>(100 + i)});
    auto rb = step_tokens(*f.service, b->id, {static_cast<int32_t>(100 + i)});
    ASSERT_TRUE(ra && rb);
    EXPECT_EQ(ra->token, rb->token) << "step " << i;
    EXPECT_EQ(ra->n_past, rb->n_past);
  }
  auto reset = f.service->reset_session(a->id);
  ASSERT_TRUE(reset);
  EXPECT_EQ(reset->n_past, 0);
  auto again = step_tokens(*f.service, a->id, {1, 2});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->n_past, 2);
  EXPECT_EQ(f.service->clone_session(12345, 0).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(f.service->reset_session(12345).error().code, ErrorCode::kNotFound);
}

TEST_P(ServiceStepTest, ModelInfoAndTokenizer) {
  auto f = ServiceFixture::make(GetParam(), test_limits());
  ASSERT_TRUE(f.service);
  const ModelInfo info = f.service->model_info();
  EXPECT_EQ(info.architecture, std::string(GetParam()).substr(7));  // "golden-<arch>"
  EXPECT_EQ(info.engine, "reference");
  EXPECT_EQ(info.n_vocab, static_cast<int32_t>(f.model->hparams().n_vocab));
  EXPECT_EQ(info.model_path, test::fixture_model_path(GetParam()));
  EXPECT_EQ(info.file_bytes, f.model->file().file_size());
  EXPECT_EQ(info.placement.size(), 6u);
  EXPECT_EQ(info.chat_template, f.model->tokenizer().vocab().chat_template);  // empty for the golden fixtures
  // The GGUF eos id (<|im_end|> in these vocabularies) and <|endoftext|>.
  const Tokenizer& tok = f.model->tokenizer();
  EXPECT_EQ(info.eos_token_ids, (std::vector<int32_t>{tok.vocab().eos_id, tok.find_token("<|endoftext|>")}));
  EXPECT_EQ(tok.vocab().eos_id, tok.find_token("<|im_end|>"));
  EXPECT_LE(info.max_session_ctx, 512);
  auto toks = f.service->tokenize("hello world", false);
  ASSERT_TRUE(toks);
  auto text = f.service->detokenize(*toks, SIZE_MAX);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, "hello world");
  EXPECT_EQ(f.service->detokenize({-1}, SIZE_MAX).error().code, ErrorCode::kInvalidArgument);
  // The size is checked against max_bytes before the text is built: exactly 11 bytes pass, 10 do not.
  EXPECT_TRUE(f.service->detokenize(*toks, 11));
  auto over = f.service->detokenize(*toks, 10);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(over.error().message,
            "the " + std::to_string(toks->size()) + " tokens decode to 11 bytes, more than the 10 allowed");
}

// The reference engine reporting max_tokens_per_item = 4 (and max_tokens_per_tick when set) and recording the
// largest item and the total tokens of every tick.
class CappedEngine final : public Engine {
 public:
  explicit CappedEngine(Engine& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  const ModelHparams& hparams() const override { return inner_.hparams(); }
  const PlacementPlan& placement() const override { return inner_.placement(); }
  EngineCachePool cache_pool() const override { return pool.tokens_total > 0 ? pool : inner_.cache_pool(); }
  EngineCapabilities capabilities() const override {
    EngineCapabilities c = inner_.capabilities();
    c.max_tokens_per_item = 4;
    c.max_tokens_per_tick = per_tick;
    c.prompt_tokens_beside_decode = beside_decode;
    return c;
  }
  int32_t max_slots() const override { return inner_.max_slots(); }
  Expected<SlotId> slot_alloc(int32_t n_ctx) override { return inner_.slot_alloc(n_ctx); }
  void slot_free(SlotId s) override { inner_.slot_free(s); }
  void slot_reset(SlotId s) override { inner_.slot_reset(s); }
  Status slot_clone(SlotId a, SlotId b) override { return inner_.slot_clone(a, b); }
  Expected<std::vector<uint8_t>> slot_snapshot(SlotId s) const override { return inner_.slot_snapshot(s); }
  Status slot_restore(SlotId s, std::span<const uint8_t> b) override { return inner_.slot_restore(s, b); }
  int64_t slot_n_past(SlotId s) const override { return inner_.slot_n_past(s); }
  int32_t slot_n_ctx(SlotId s) const override { return inner_.slot_n_ctx(s); }
  Status check(const EngineStepItem& item) const override { return inner_.check(item); }
  void step(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out) override {
    if (fail_from_tick >= 0 && static_cast<int>(total_per_tick.size()) >= fail_from_tick) {
      // Refuses every item without touching its slot, as the CUDA engine does when its KV pool has no page left.
      for (EngineStepOutput& o : out) o.status = make_error(ErrorCode::kResourceExhausted, "the KV cache pool is full");
      return;
    }
    size_t largest = 0, total = 0;
    for (const EngineStepItem& it : items) largest = std::max(largest, it.tokens.size()), total += it.tokens.size();
    largest_per_tick.push_back(largest);
    total_per_tick.push_back(total);
    items_per_tick.push_back(items.size());
    inner_.step(items, out);
  }
  std::vector<size_t> largest_per_tick;  // engine loop thread; read after the step's callback
  std::vector<size_t> total_per_tick;
  std::vector<size_t> items_per_tick;
  int32_t per_tick = 0;
  int32_t beside_decode = 0;
  int fail_from_tick = -1;  // from this tick on (counting those that ran) every item fails; -1: never
  EngineCachePool pool;     // reported instead of the inner engine's when it has tokens

 private:
  Engine& inner_;
};

// A Service over a CappedEngine around a golden fixture's reference engine: a test sets the engine's knobs, then
// start() puts that Service in place of the fixture's own.
class ServiceCapabilities : public ::testing::Test {
 protected:
  void SetUp() override {
    f = ServiceFixture::make("golden-qwen35moe", test_limits());
    ASSERT_TRUE(f.service);
    capped = std::make_unique<CappedEngine>(*f.engine);
  }
  void start() {
    f.service.reset();
    auto s = make_service(*f.model, *capped, test_limits());
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    service = std::move(*s);
  }
  // A 30-token prompt while two other sessions generate (up to 200 tokens, EOS ignored; the prompt starts once both
  // have produced a token, and they are cancelled after it): the prompt's result must be the greedy token of the
  // prompt run alone. The tick shapes are left in `capped` for the caller.
  void prompt_beside_two_decoders();

  ServiceFixture f;
  std::unique_ptr<CappedEngine> capped;
  std::unique_ptr<Service> service;  // over *capped (start())
};

TEST_F(ServiceCapabilities, PromptsAreCutToTheEnginesTokensPerItem) {
  ASSERT_NO_FATAL_FAILURE(start());
  auto sess = service->create_session({});
  ASSERT_TRUE(sess);
  const std::vector<int32_t> prompt = iota_tokens(10);
  auto r = step_tokens(*service, sess->id, prompt);
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_GE(capped->largest_per_tick.size(), 3u) << "10 tokens at 4 a tick take 3 ticks";
  for (size_t n : capped->largest_per_tick) EXPECT_LE(n, 4u);
  const std::vector<StepResult> want = direct_steps(*f.model, test_limits().default_sampling, {prompt}, 256);
  EXPECT_EQ(r->token, want[0].token) << "cutting the prompt changes nothing of the result";
}

// max_tokens_per_tick bounds a tick only while sessions decode: a prompt alone gets max_tokens_per_item a tick (the
// CUDA engine runs it as prompt passes), not the 2 tokens the tick would hold beside decoders.
TEST_F(ServiceCapabilities, APromptAloneTakesTheTokensPerItem) {
  capped->per_tick = 2;
  ASSERT_NO_FATAL_FAILURE(start());
  auto sess = service->create_session({});
  ASSERT_TRUE(sess);
  const std::vector<int32_t> prompt = iota_tokens(10);
  auto r = step_tokens(*service, sess->id, prompt);
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_FALSE(capped->largest_per_tick.empty());
  EXPECT_EQ(capped->largest_per_tick[0], 4u) << "the prompt's first tick carries max_tokens_per_item tokens";
  const std::vector<StepResult> want = direct_steps(*f.model, test_limits().default_sampling, {prompt}, 256);
  EXPECT_EQ(r->token, want[0].token);
}

// The Service's stats carry the engine's shared pool as the engine reports it (none for the reference engine).
TEST_F(ServiceCapabilities, StatsCarryTheEnginesCachePool) {
  EXPECT_EQ(f.service->stats().cache.tokens_total, 0) << "the reference engine's slots own their caches";
  capped->pool = EngineCachePool{8192, 512, 1u << 20};
  ASSERT_NO_FATAL_FAILURE(start());
  const ServiceStats st = service->stats();
  EXPECT_EQ(st.cache.tokens_total, 8192);
  EXPECT_EQ(st.cache.tokens_held, 512);
  EXPECT_EQ(st.cache.bytes, 1u << 20);
}

// An engine failure after a prompt's first ticks: the error says how much of the request was fed and where the
// session now stands, and the session goes on from there (the rest of the prompt gives the whole prompt's token).
TEST_F(ServiceCapabilities, AFailureMidPromptSaysWhatWasFed) {
  capped->fail_from_tick = 2;  // 4 tokens a tick: 8 of 10 fed, then the failure
  ASSERT_NO_FATAL_FAILURE(start());
  auto sess = service->create_session({});
  ASSERT_TRUE(sess);
  const std::vector<int32_t> prompt = iota_tokens(10);
  auto r = step_tokens(*service, sess->id, prompt);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(r.error().message,
            "the KV cache pool is full (after 8 of the request's 10 tokens were fed; the session's n_past is now 8)");
  capped->fail_from_tick = -1;
  auto rest = step_tokens(*service, sess->id, std::vector<int32_t>(prompt.begin() + 8, prompt.end()));
  ASSERT_TRUE(rest) << rest.error().to_string();
  EXPECT_EQ(rest->n_past, 10);
  const std::vector<StepResult> want = direct_steps(*f.model, test_limits().default_sampling, {prompt}, 256);
  EXPECT_EQ(rest->token, want[0].token);

  // A failure on the first tick: nothing was fed, the message is the engine's own.
  capped->fail_from_tick = static_cast<int>(capped->total_per_tick.size());
  auto none = step_tokens(*service, sess->id, {5, 6});
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().message, "the KV cache pool is full");
}

void ServiceCapabilities::prompt_beside_two_decoders() {
  ASSERT_NO_FATAL_FAILURE(start());
  std::vector<std::shared_ptr<test::RecordingSink>> sinks;
  for (int i = 0; i < 2; ++i) {
    auto s = service->create_session({});
    ASSERT_TRUE(s);
    ASSERT_TRUE(step_tokens(*service, s->id, iota_tokens(3 + i)));
    GenerateRequest g = test::gen_request(s->id, {5}, 200);
    g.ignore_eos = true;
    sinks.push_back(std::make_shared<test::RecordingSink>());
    service->generate(std::move(g), sinks.back());
  }
  for (const auto& sink : sinks) {
    for (int i = 0; i < 10000 && sink->n_chunks() == 0 && !sink->done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GT(sink->n_chunks(), 0u) << "a decoder produced no token";
  }
  auto p = service->create_session({});
  ASSERT_TRUE(p);
  const std::vector<int32_t> prompt = iota_tokens(30);
  auto r = step_tokens(*service, p->id, prompt);
  for (const auto& sink : sinks) sink->cancel();
  for (const auto& sink : sinks) EXPECT_TRUE(sink->wait());
  ASSERT_TRUE(r) << r.error().to_string();
  const std::vector<StepResult> want = direct_steps(*f.model, test_limits().default_sampling, {prompt}, 256);
  EXPECT_EQ(r->token, want[0].token);
}

// With max_tokens_per_tick = 5, a prompt beside two sessions that decode gets the 3 tokens they leave of a tick
// while they generate, and no tick carries more than 5 tokens.
TEST_F(ServiceCapabilities, PromptsShareATickWithDecodingSessions) {
  capped->per_tick = 5;
  ASSERT_NO_FATAL_FAILURE(prompt_beside_two_decoders());
  bool shared = false;
  for (size_t k = 0; k < capped->total_per_tick.size(); ++k) {
    EXPECT_LE(capped->total_per_tick[k], 5u) << "tick " << k;
    shared = shared || (capped->items_per_tick[k] == 3 && capped->largest_per_tick[k] == 3);
  }
  EXPECT_TRUE(shared) << "a prompt chunk of 3 beside the two decoders";
}

// With prompt_tokens_beside_decode = 1, a prompt beside two decoding sessions gets 2 tokens a tick (their count)
// though the tick holds 32, and more once they stop.
TEST_F(ServiceCapabilities, PromptsBesideDecodeGetTheEnginesShare) {
  capped->per_tick = 32;
  capped->beside_decode = 1;
  ASSERT_NO_FATAL_FAILURE(prompt_beside_two_decoders());
  bool shared = false;
  for (size_t k = 0; k < capped->total_per_tick.size(); ++k) {
    if (capped->items_per_tick[k] == 3) {
      EXPECT_EQ(capped->largest_per_tick[k], 2u) << "tick " << k << ": the prompt's share beside two decoders";
      shared = true;
    }
  }
  EXPECT_TRUE(shared) << "the prompt ran beside the decoders";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServiceStepTest,
                         ::testing::Values("golden-qwen35moe", "golden-qwen35", "golden-qwen3next"));

}  // namespace
}  // namespace kestrel::daemon
