// SamplingParams::validate: defaults and edge values pass; every bad field is refused with its name in the message.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/sampler/sampling_params.h"

namespace kestrel {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(SamplingParams, DefaultsAndEdgesAreValid) {
  SamplingParams p;
  EXPECT_TRUE(p.validate());
  EXPECT_FALSE(p.penalties_active());
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.top_k = 1;
  p.penalty_last_n = -1;
  p.n_logprobs = 20;
  p.presence_penalty = -2.0f;  // negative presence/frequency encourage repetition; allowed (OpenAI's range)
  p.frequency_penalty = -2.0f;
  p.repetition_penalty = 0.5f;
  EXPECT_TRUE(p.validate());
  EXPECT_TRUE(p.penalties_active());
  p.penalty_last_n = 0;
  EXPECT_FALSE(p.penalties_active());
}

struct BadCase {
  const char* field;
  std::function<void(SamplingParams&)> mutate;
};

TEST(SamplingParams, RejectsEachBadField) {
  const std::vector<BadCase> cases = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kNan; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -1; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.5f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = kNan; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = kNan; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -1.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = kNan; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = kInf; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = kNan; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -kInf; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = kNan; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = kInf; }},
      {"penalty_last_n", [](SamplingParams& p) { p.penalty_last_n = -2; }},
      {"n_logprobs", [](SamplingParams& p) { p.n_logprobs = 21; }},
      {"n_logprobs", [](SamplingParams& p) { p.n_logprobs = -1; }},
  };
  for (const BadCase& c : cases) {
    SamplingParams p;
    c.mutate(p);
    const Status s = p.validate();
    ASSERT_FALSE(s) << c.field;
    EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.error().message.find(c.field), std::string::npos) << s.error().message;
  }
}

TEST(SamplingParams, MessageShowsTheValue) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_EQ(p.validate().error().message, "sampling parameter top_p must be in (0, 1] (1 = off), got 1.5");
}

}  // namespace
}  // namespace kestrel
