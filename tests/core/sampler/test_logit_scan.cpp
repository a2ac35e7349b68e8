// Whole-vocabulary scans: maximum and argmax (NaN ignored, ties to the lowest id, every tail length of the
// vectorized loop), and the validity flags used by Sampler::sample_checked.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "core/sampler/logit_scan.h"

namespace kestrel {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(LogitScan, MaxAndArgmaxAtEveryPositionAndLength) {
  for (size_t n = 1; n <= 40; ++n) {
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> logits(n, -1.0f);
      for (size_t i = 0; i < n; i += 3) logits[i] = kNan;  // NaN never wins
      logits[at] = 2.0f;
      ASSERT_EQ(max_logit_of(logits), 2.0f) << n << " " << at;
      ASSERT_EQ(argmax_lowest(logits), static_cast<int32_t>(at)) << n << " " << at;
      if (at + 1 < n) {
        logits[n - 1] = 2.0f;  // a tie later on: the lower id wins
        ASSERT_EQ(argmax_lowest(logits), static_cast<int32_t>(at));
      }
    }
  }
  EXPECT_EQ(max_logit_of(std::vector<float>{-kInf, kNan, -kInf}), -kInf);
  EXPECT_EQ(argmax_lowest(std::vector<float>{-kInf, -kInf}), 0);
  EXPECT_EQ(argmax_lowest(std::vector<float>{-kInf, -kInf, -5.0f}), 2);
}

TEST(LogitScan, FlagsNanPositiveInfinityAndAllMasked) {
  for (size_t n : {1u, 3u, 4u, 5u, 9u}) {
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> logits(n, 0.5f);
      EXPECT_FALSE(scan_logits(logits).any_nan_or_pos_inf);
      EXPECT_TRUE(scan_logits(logits).any_unmasked);
      logits[at] = kNan;
      EXPECT_TRUE(scan_logits(logits).any_nan_or_pos_inf) << n << " " << at;
      logits[at] = kInf;
      EXPECT_TRUE(scan_logits(logits).any_nan_or_pos_inf) << n << " " << at;
      logits[at] = -kInf;
      EXPECT_FALSE(scan_logits(logits).any_nan_or_pos_inf) << n << " " << at;
      std::vector<float> masked(n, -kInf);
      EXPECT_FALSE(scan_logits(masked).any_unmasked);
      masked[at] = -1e30f;
      EXPECT_TRUE(scan_logits(masked).any_unmasked) << n << " " << at;
      masked[at] = kInf;
      EXPECT_FALSE(scan_logits(masked).any_unmasked);  // +inf is not a usable logit
    }
  }
}

}  // namespace
}  // namespace kestrel
