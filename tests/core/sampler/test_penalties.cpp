// Penalties: each penalty changes exactly the logits of window tokens, by the llama.cpp amounts; the window
// follows penalty_last_n; masked logits stay masked; bad history ids are refused by the checked form.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/sampler/penalties.h"

namespace kestrel {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> penalized(const SamplingParams& p, std::vector<float> logits, const std::vector<int32_t>& history) {
  PenaltyCounter counter(static_cast<int32_t>(logits.size()));
  const Status s = apply_penalties(p, history, logits, &counter);
  EXPECT_TRUE(s) << (s ? "" : s.error().message);
  return logits;
}

const std::vector<float> fixture_logits = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -4.0f};
const std::vector<int32_t> fixture_history = {0, 1, 1, 3, 3, 3};  // counts: 0→1, 1→2, 3→3

TEST(Penalties, RepetitionDividesPositiveMultipliesNonPositive) {
  SamplingParams p;
  p.penalty_last_n = -1;
  p.repetition_penalty = 2.0f;
  const auto out = penalized(p, fixture_logits, fixture_history);
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f, 0.5f, 1.5f, 0.0f, -4.0f}));
}

TEST(Penalties, PresenceSubtractsOncePerDistinctToken) {
  SamplingParams p;
  p.penalty_last_n = -1;
  p.presence_penalty = 0.5f;
  const auto out = penalized(p, fixture_logits, fixture_history);
  EXPECT_EQ(out, (std::vector<float>{1.5f, -1.5f, 0.5f, 2.5f, 0.0f, -4.0f}));
}

TEST(Penalties, FrequencySubtractsPerOccurrence) {
  SamplingParams p;
  p.penalty_last_n = -1;
  p.frequency_penalty = 0.25f;
  const auto out = penalized(p, fixture_logits, fixture_history);
  EXPECT_EQ(out, (std::vector<float>{1.75f, -1.5f, 0.5f, 2.25f, 0.0f, -4.0f}));
}

TEST(Penalties, AllThreeComposeRepetitionFirst) {
  SamplingParams p;
  p.penalty_last_n = -1;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const auto out = penalized(p, fixture_logits, fixture_history);
  // token 0: 2/2 - (1*0.25 + 0.5) = 0.25; token 1: -1*2 - (2*0.25 + 0.5) = -3; token 3: 3/2 - (3*0.25 + 0.5) = 0.25
  EXPECT_EQ(out, (std::vector<float>{0.25f, -3.0f, 0.5f, 0.25f, 0.0f, -4.0f}));
}

TEST(Penalties, WindowFollowsPenaltyLastN) {
  SamplingParams p;
  p.frequency_penalty = 1.0f;
  p.penalty_last_n = 2;  // window = {3, 3}
  EXPECT_EQ(penalized(p, fixture_logits, fixture_history), (std::vector<float>{2.0f, -1.0f, 0.5f, 1.0f, 0.0f, -4.0f}));
  p.penalty_last_n = 4;  // window = {1, 3, 3, 3}
  EXPECT_EQ(penalized(p, fixture_logits, fixture_history), (std::vector<float>{2.0f, -2.0f, 0.5f, 0.0f, 0.0f, -4.0f}));
  p.penalty_last_n = 100;  // longer than the history: all of it
  EXPECT_EQ(penalized(p, fixture_logits, fixture_history), (std::vector<float>{1.0f, -3.0f, 0.5f, 0.0f, 0.0f, -4.0f}));
  p.penalty_last_n = 0;  // off
  EXPECT_EQ(penalized(p, fixture_logits, fixture_history), fixture_logits);

  EXPECT_EQ(penalty_window(fixture_history, 2).size(), 2u);
  EXPECT_EQ(penalty_window(fixture_history, -1).size(), fixture_history.size());
  EXPECT_TRUE(penalty_window(fixture_history, 0).empty());
  EXPECT_TRUE(penalty_window({}, 5).empty());
}

TEST(Penalties, CounterIsCleanBetweenCalls) {
  SamplingParams p;
  p.penalty_last_n = -1;
  p.frequency_penalty = 1.0f;
  PenaltyCounter counter(6);
  std::vector<float> a = fixture_logits;
  ASSERT_TRUE(apply_penalties(p, fixture_history, a, &counter));
  std::vector<float> b = fixture_logits;
  const std::vector<int32_t> other = {2};
  ASSERT_TRUE(apply_penalties(p, other, b, &counter));
  EXPECT_EQ(b, (std::vector<float>{2.0f, -1.0f, -0.5f, 3.0f, 0.0f, -4.0f}));  // no counts left over from `a`
}

TEST(Penalties, MaskedStaysMaskedAndFiniteStaysFinite) {
  SamplingParams p;
  p.penalty_last_n = -1;
  p.repetition_penalty = 0.5f;  // < 1 boosts: a huge positive logit would overflow without the clamp
  p.presence_penalty = 1.0f;
  const float big = std::numeric_limits<float>::max();
  const auto out = penalized(p, {kNegInf, big, 1.0f}, {0, 1});
  EXPECT_EQ(out[0], kNegInf);
  EXPECT_EQ(out[1], big);
  EXPECT_EQ(out[2], 1.0f);
}

TEST(Penalties, CheckedFormRefusesBadInput) {
  SamplingParams p;
  p.penalty_last_n = -1;
  p.presence_penalty = 1.0f;
  PenaltyCounter counter(6);
  std::vector<float> logits = fixture_logits;
  const std::vector<int32_t> out_of_range = {0, 6};
  const Status s = apply_penalties(p, out_of_range, logits, &counter);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().message.find("history token 6"), std::string::npos);
  EXPECT_EQ(logits, fixture_logits);  // refused before anything changed
  const std::vector<int32_t> negative = {-1};
  EXPECT_FALSE(apply_penalties(p, negative, logits, &counter));
  std::vector<float> short_logits(5, 0.0f);
  EXPECT_FALSE(apply_penalties(p, fixture_history, short_logits, &counter));
  // An out-of-range id outside the window is never read, so it is not an error.
  p.penalty_last_n = 1;
  const std::vector<int32_t> old_bad = {99, 2};
  EXPECT_TRUE(apply_penalties(p, old_bad, logits, &counter));
}

}  // namespace
}  // namespace kestrel
