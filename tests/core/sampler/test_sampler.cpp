// Sampler end to end: greedy, the temperature distribution (chi-square against softmax(logits / T)), truncation
// inside the chain, determinism (seed, clone, snapshot), a draw sequence pinned by an independent Python
// reference (draw_reference.py), log-probabilities, and the checked entry point's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/sampler/sampler.h"

namespace kestrel {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

Sampler make(const SamplingParams& p, int32_t n_vocab) {
  auto s = Sampler::create(p, n_vocab);
  EXPECT_TRUE(s) << (s ? "" : s.error().message);
  return std::move(s).value();
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp((logits[i] - max_logit) / temperature);
  for (double& v : p) v /= total;
  return p;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = n * probs[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);  // test data only
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> out(n);
  for (float& v : out) v = dist(gen);
  return out;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s = make(p, 6);
  const std::vector<float> logits = {1.0f, 4.0f, -2.0f, 4.0f, 3.9f, kNegInf};
  const auto before = s.rng_state();
  EXPECT_EQ(*s.sample_checked(logits, {}, nullptr), 1);
  EXPECT_EQ(s.rng_state(), before);  // greedy draws no random numbers
  EXPECT_EQ(argmax_lowest(std::vector<float>{2.0f, 2.0f, 2.0f}), 0);
  EXPECT_EQ(argmax_lowest(std::vector<float>{kNegInf, kNegInf, 0.0f}), 2);
}

TEST(Sampler, GreedyAppliesPenalties) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 1.1f;  // 5.0 / 1.1 = 4.545 < 4.9
  Sampler s = make(p, 3);
  const std::vector<float> logits = {5.0f, 4.9f, 0.0f};
  const std::vector<int32_t> none = {};
  const std::vector<int32_t> seen = {2, 0};
  EXPECT_EQ(*s.sample_checked(logits, none, nullptr), 0);
  EXPECT_EQ(*s.sample_checked(logits, seen, nullptr), 1);
  // Truncation settings cannot change a greedy answer.
  p.top_k = 1;
  p.min_p = 0.9f;
  ASSERT_TRUE(s.set_params(p));
  EXPECT_EQ(*s.sample_checked(logits, seen, nullptr), 1);
}

TEST(Sampler, TemperatureMatchesSoftmaxDistribution) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  constexpr int kDraws = 20000;
  constexpr double kChi2Df4At999 = 18.47;  // 99.9% quantile of chi-square with 4 degrees of freedom
  for (float t : {0.7f, 1.0f, 1.8f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 1234;
    Sampler s = make(p, 5);
    std::vector<int> counts(5, 0);
    for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(s.sample(logits, {}, nullptr))];
    EXPECT_LT(chi_square(counts, softmax(logits, t), kDraws), kChi2Df4At999) << "T=" << t;
    // The bound has power: the same counts are far from the distribution at another temperature.
    EXPECT_GT(chi_square(counts, softmax(logits, t * 1.5), kDraws), 10 * kChi2Df4At999) << "T=" << t;
  }
}

TEST(Sampler, TopKInsideTheChainRenormalizes) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  SamplingParams p;
  p.top_k = 2;
  p.temperature = 0.8f;
  p.seed = 5;
  Sampler s = make(p, 5);
  constexpr int kDraws = 20000;
  std::vector<int> counts(5, 0);
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(s.sample(logits, {}, nullptr))];
  EXPECT_EQ(counts[0] + counts[2] + counts[3], 0);  // only ids 1 (2.0) and 4 (1.5) survive
  const auto kept = softmax({2.0f, 1.5f}, 0.8);
  EXPECT_LT(chi_square({counts[1], counts[4]}, kept, kDraws), 10.83);  // 99.9% quantile, 1 degree of freedom
}

TEST(Sampler, TopPAndMinPInsideTheChain) {
  // p = 0.5, 0.3, 0.1, 0.06, 0.04. top-p 0.75 keeps {0, 1}; min-p 0.15 keeps {0, 1, 2}.
  const std::vector<float> logits = {static_cast<float>(std::log(0.5)), static_cast<float>(std::log(0.3)),
                                     static_cast<float>(std::log(0.1)), static_cast<float>(std::log(0.06)),
                                     static_cast<float>(std::log(0.04))};
  auto drawn = [&](SamplingParams p) {
    Sampler s = make(p, 5);
    std::set<int32_t> seen;
    for (int i = 0; i < 3000; ++i) seen.insert(s.sample(logits, {}, nullptr));
    return seen;
  };
  SamplingParams top_p;
  top_p.top_p = 0.75f;
  EXPECT_EQ(drawn(top_p), (std::set<int32_t>{0, 1}));
  SamplingParams min_p;
  min_p.min_p = 0.15f;
  EXPECT_EQ(drawn(min_p), (std::set<int32_t>{0, 1, 2}));
  SamplingParams none;
  EXPECT_EQ(drawn(none), (std::set<int32_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, MaskedTokensAreNeverDrawn) {
  std::vector<float> logits = {0.0f, 5.0f, 0.0f, 0.0f};
  logits[1] = kNegInf;
  SamplingParams p;
  p.temperature = 2.0f;
  Sampler s = make(p, 4);
  for (int i = 0; i < 2000; ++i) ASSERT_NE(*s.sample_checked(logits, {}, nullptr), 1);
}

TEST(SamplerDraw, MatchesPythonReference) {
  // Tokens printed by tests/core/sampler/draw_reference.py (seed 7, T = 0.8, no truncation).
  const std::vector<float> logits = {0.25f, -1.5f, 2.0f, 1.0f, -0.5f, 0.75f, 1.75f, -3.0f};
  const std::vector<int32_t> want = {6, 2, 6, 6, 6, 6, 2, 2, 2, 2, 3, 6, 6, 6, 2, 3,
                                     2, 2, 2, 2, 2, 5, 5, 2, 6, 2, 0, 4, 2, 3, 2, 2};
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 7;
  Sampler s = make(p, 8);
  std::vector<int32_t> got;
  for (size_t i = 0; i < want.size(); ++i) got.push_back(s.sample(logits, {}, nullptr));
  EXPECT_EQ(got, want);
}

SamplingParams busy_params(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 200;
  p.top_p = 0.95f;
  p.min_p = 0.01f;
  p.repetition_penalty = 1.2f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.1f;
  p.penalty_last_n = 32;
  p.seed = seed;
  return p;
}

// Generates n tokens, feeding each back into the history (the way a session does).
std::vector<int32_t> generate(Sampler& s, const std::vector<float>& logits, std::vector<int32_t>* history, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = *s.sample_checked(logits, *history, nullptr);
    history->push_back(t);
    out.push_back(t);
  }
  return out;
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  const auto logits = random_logits(4096, 21);
  std::vector<int32_t> h1, h2, h3;
  Sampler a = make(busy_params(77), 4096);
  Sampler b = make(busy_params(77), 4096);
  Sampler c = make(busy_params(78), 4096);
  const auto ta = generate(a, logits, &h1, 200);
  EXPECT_EQ(ta, generate(b, logits, &h2, 200));
  EXPECT_NE(ta, generate(c, logits, &h3, 200));
  EXPECT_GT(std::set<int32_t>(ta.begin(), ta.end()).size(), 10u);  // it really samples
}

TEST(Sampler, CloneContinuesIdentically) {
  const auto logits = random_logits(4096, 22);
  Sampler a = make(busy_params(3), 4096);
  std::vector<int32_t> history;
  generate(a, logits, &history, 10);
  Sampler fork = a.clone();
  std::vector<int32_t> history_fork = history;
  const auto ta = generate(a, logits, &history, 50);
  EXPECT_EQ(ta, generate(fork, logits, &history_fork, 50));
  // Independent after the fork: advancing one does not advance the other.
  generate(a, logits, &history, 1);
  EXPECT_NE(a.rng_state(), fork.rng_state());
}

TEST(Sampler, SnapshotAndReseed) {
  const auto logits = random_logits(1000, 23);
  SamplingParams p = busy_params(9);
  Sampler a = make(p, 1000);
  std::vector<int32_t> history;
  generate(a, logits, &history, 5);
  const Rng::State saved = a.rng_state();
  std::vector<int32_t> h1 = history, h2 = history;
  const auto first = generate(a, logits, &h1, 20);
  ASSERT_TRUE(a.restore_rng_state(saved));
  EXPECT_EQ(generate(a, logits, &h2, 20), first);
  EXPECT_FALSE(a.restore_rng_state(Rng::State{0, 0, 0, 0}));

  // set_params keeps the stream; reseed restarts it.
  a.reseed(9);
  Sampler fresh = make(p, 1000);
  EXPECT_EQ(a.rng_state(), fresh.rng_state());
  SamplingParams bad = p;
  bad.top_p = 2.0f;
  EXPECT_FALSE(a.set_params(bad));
  EXPECT_EQ(a.params().top_p, p.top_p);  // unchanged on error
}

TEST(Sampler, LogprobsArePostPenaltyPreTruncation) {
  const auto raw = random_logits(5000, 24);
  SamplingParams p;
  p.temperature = 0.3f;
  p.top_k = 1;  // truncation and temperature must not show in the log-probabilities
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 0.5f;
  p.penalty_last_n = -1;
  p.n_logprobs = 20;
  Sampler s = make(p, 5000);
  const std::vector<int32_t> history = {10, 20, 20, 30};
  SampleResult r;
  const int32_t token = *s.sample_checked(raw, history, &r);
  EXPECT_EQ(r.token, token);
  ASSERT_TRUE(r.has_logprobs);

  std::vector<float> penalized = raw;
  PenaltyCounter counter(5000);
  ASSERT_TRUE(apply_penalties(p, history, penalized, &counter));
  const auto lp = log_softmax(penalized);
  double sum = 0.0;
  for (double v : lp) sum += std::exp(v);
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_EQ(token, argmax_lowest(penalized));  // top_k = 1
  EXPECT_FLOAT_EQ(r.logprob, static_cast<float>(lp[static_cast<size_t>(token)]));
  EXPECT_LT(r.logprob, -0.01f);  // not 0, as it would be over the top-1 set
  ASSERT_EQ(r.top.size(), 20u);
  EXPECT_EQ(r.top[0].id, token);
  for (size_t i = 0; i < r.top.size(); ++i) {
    EXPECT_FLOAT_EQ(r.top[i].logprob, static_cast<float>(lp[static_cast<size_t>(r.top[i].id)]));
    if (i > 0) {
      EXPECT_TRUE(r.top[i - 1].logprob > r.top[i].logprob ||
                  (r.top[i - 1].logprob == r.top[i].logprob && r.top[i - 1].id < r.top[i].id));
    }
  }
  // A penalized token's logprob reflects the penalty.
  EXPECT_FLOAT_EQ(static_cast<float>(lp[20]), static_cast<float>(penalized[20] - log_sum_exp(penalized)));
  EXPECT_NE(penalized[20], raw[20]);

  // n_logprobs = 0: none computed.
  p.n_logprobs = 0;
  ASSERT_TRUE(s.set_params(p));
  ASSERT_TRUE(s.sample_checked(raw, history, &r));
  EXPECT_FALSE(r.has_logprobs);
  EXPECT_TRUE(r.top.empty());
}

TEST(Sampler, CheckedEntryRefusesBadInput) {
  SamplingParams p;
  p.presence_penalty = 1.0f;
  Sampler s = make(p, 4);
  auto expect_refused = [&](const std::vector<float>& logits, const std::vector<int32_t>& history,
                            const std::string& needle) {
    const auto before = s.rng_state();
    auto r = s.sample_checked(logits, history, nullptr);
    ASSERT_FALSE(r) << needle;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
    EXPECT_EQ(s.rng_state(), before);  // a refused call consumes nothing
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  expect_refused({0.0f, nan, 1.0f, 2.0f}, {}, "token 1 is NaN");
  expect_refused({0.0f, 1.0f, inf, 2.0f}, {}, "token 2 is +inf");
  expect_refused({kNegInf, kNegInf, kNegInf, kNegInf}, {}, "every logit is -inf");
  expect_refused({0.0f, 1.0f, 2.0f}, {}, "3 logits for a vocabulary of 4");
  expect_refused({0.0f, 1.0f, 2.0f, 3.0f}, {1, 4}, "history token 4");
  EXPECT_TRUE(s.sample_checked(std::vector<float>{0.0f, kNegInf, 1.0f, 2.0f}, std::vector<int32_t>{1, 3}, nullptr));
}

TEST(Sampler, CreateRefusesBadParamsAndVocab) {
  SamplingParams p;
  p.temperature = -1.0f;
  auto bad = Sampler::create(p, 10);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("temperature"), std::string::npos);
  EXPECT_FALSE(Sampler::create(SamplingParams{}, 0));
}

}  // namespace
}  // namespace kestrel
