// Log-probabilities: log_softmax normalizes (sum of exp = 1), masked tokens are -inf and never listed, top-n is
// the n best sorted by logprob descending with ties by lower id.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/sampler/logprobs.h"

namespace kestrel {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(Logprobs, LogSoftmaxSumsToOne) {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> logits(248320);  // a Qwen3.5-sized vocabulary
  for (float& v : logits) v = dist(gen);
  logits[5] = 60.0f;  // a dominant token: the max shift must keep this exact
  const auto lp = log_softmax(logits);
  double sum = 0.0;
  for (double v : lp) sum += std::exp(v);
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_LE(lp[5], 0.0);
  EXPECT_GT(lp[5], -1e-9);
}

TEST(Logprobs, MaskedTokensHaveMinusInfinity) {
  const std::vector<float> logits = {kNegInf, 0.0f, kNegInf, 0.0f};
  const auto lp = log_softmax(logits);
  EXPECT_EQ(lp[0], -std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(lp[1], std::log(0.5));
  EXPECT_DOUBLE_EQ(lp[3], std::log(0.5));
  std::vector<TokenLogprob> top;
  top_logprobs(logits, log_sum_exp(logits), 4, &top);
  ASSERT_EQ(top.size(), 2u);  // only the finite ones
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 3);
  const std::vector<float> all_masked = {kNegInf, kNegInf};
  EXPECT_EQ(log_sum_exp(all_masked), -std::numeric_limits<double>::infinity());
}

TEST(Logprobs, TopNSortedDescendingTiesByLowerId) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 2.0f, 0.0f};
  const double lse = log_sum_exp(logits);
  std::vector<TokenLogprob> top;
  top_logprobs(logits, lse, 5, &top);
  ASSERT_EQ(top.size(), 5u);
  const std::vector<int32_t> want = {1, 3, 2, 5, 0};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(top[i].id, want[i]) << i;
    EXPECT_FLOAT_EQ(top[i].logprob, static_cast<float>(logits[static_cast<size_t>(want[i])] - lse));
  }
  top_logprobs(logits, lse, 0, &top);
  EXPECT_TRUE(top.empty());
}

TEST(Logprobs, TopNMatchesFullSortOnLargeVocab) {
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(100000);
  for (float& v : logits) v = dist(gen);
  const auto lp = log_softmax(logits);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return lp[static_cast<size_t>(a)] != lp[static_cast<size_t>(b)]
               ? lp[static_cast<size_t>(a)] > lp[static_cast<size_t>(b)]
               : a < b;
  });
  std::vector<TokenLogprob> top;
  top_logprobs(logits, log_sum_exp(logits), 20, &top);
  ASSERT_EQ(top.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(top[i].id, order[i]);
    if (i > 0) {
      EXPECT_GE(top[i - 1].logprob, top[i].logprob);
    }
  }
}

}  // namespace
}  // namespace kestrel
