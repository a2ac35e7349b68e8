// Tests of the round-trip timing helpers behind `kestrel bench` and bench_roundtrip (client/cli/step_roundtrip.h):
// nearest-rank percentiles, the decode loop's token feedback and context resets, and error propagation.
#include <gtest/gtest.h>

#include <numeric>

#include "client/cli/step_roundtrip.h"

namespace kestrel::cli {
namespace {

TEST(StepRoundtrip, NearestRankPercentiles) {
  std::vector<double> v(100);
  std::iota(v.begin(), v.end(), 1.0);  // 1..100, reversed below
  std::reverse(v.begin(), v.end());
  const LatencySummary s = summarize_latency(v);
  EXPECT_EQ(s.n, 100u);
  EXPECT_DOUBLE_EQ(s.p50_us, 50.0);
  EXPECT_DOUBLE_EQ(s.p90_us, 90.0);
  EXPECT_DOUBLE_EQ(s.p99_us, 99.0);
  EXPECT_DOUBLE_EQ(s.min_us, 1.0);
  EXPECT_DOUBLE_EQ(s.max_us, 100.0);
  EXPECT_DOUBLE_EQ(s.mean_us, 50.5);

  std::vector<double> one = {7.0};
  const LatencySummary o = summarize_latency(one);
  EXPECT_DOUBLE_EQ(o.p50_us, 7.0);
  EXPECT_DOUBLE_EQ(o.p99_us, 7.0);
  std::vector<double> none;
  EXPECT_EQ(summarize_latency(none).n, 0u);
}

TEST(StepRoundtrip, FeedsBackTokensAndResetsBeforeOverflow) {
  RoundTripOptions o;
  o.steps = 10;
  o.warmup = 2;
  o.tokens_per_step = 2;
  o.n_ctx = 7;  // 3 steps of 2 tokens fit, the 4th needs a reset
  o.first_token = 5;
  std::vector<std::vector<int32_t>> calls;
  int resets = 0;
  auto samples = time_step_roundtrips(
      o,
      [&](std::span<const int32_t> t) -> Expected<int32_t> {
        calls.emplace_back(t.begin(), t.end());
        return t[0] + 1;
      },
      [&]() -> Status {
        ++resets;
        return ok_status();
      });
  ASSERT_TRUE(samples) << samples.error().message;
  EXPECT_EQ(samples->size(), 10u);  // warm-up calls are not timed
  ASSERT_EQ(calls.size(), 12u);
  EXPECT_EQ(resets, 3);  // before calls 4, 7 and 10
  EXPECT_EQ(calls[0], (std::vector<int32_t>{5, 5}));
  EXPECT_EQ(calls[1], (std::vector<int32_t>{6, 6}));  // the sampled token fed back
  EXPECT_EQ(calls[2], (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(calls[3], (std::vector<int32_t>{5, 5}));  // after a reset: the first token again
}

TEST(StepRoundtrip, ErrorsStopTheLoop) {
  RoundTripOptions o;
  o.steps = 5;
  o.warmup = 0;
  int n = 0;
  auto r = time_step_roundtrips(
      o,
      [&](std::span<const int32_t>) -> Expected<int32_t> {
        if (++n == 3) return make_error(ErrorCode::kNotFound, "NOT_FOUND: session 1 does not exist");
        return 1;
      },
      [] { return ok_status(); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(n, 3);

  o.tokens_per_step = o.n_ctx;
  EXPECT_FALSE(time_step_roundtrips(
      o, [](std::span<const int32_t>) -> Expected<int32_t> { return 0; }, [] { return ok_status(); }));
  auto calls = time_calls(4, 1, [] { return ok_status(); });
  ASSERT_TRUE(calls);
  EXPECT_EQ(calls->size(), 4u);
  EXPECT_FALSE(time_calls(3, 0, [] { return Status(make_error(ErrorCode::kUnavailable, "draining")); }));
}

}  // namespace
}  // namespace kestrel::cli
