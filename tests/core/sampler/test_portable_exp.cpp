// exp_portable against std::exp: within 1 ulp of the correctly rounded f32 value over the whole range the sampler
// uses (an exhaustive run over every f32 in [-87, 88] also found 1 ulp; this samples 2M of them), and the edges.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/sampler/portable_exp.h"

namespace kestrel {
namespace {

TEST(PortableExp, WithinOneUlpOfCorrectlyRounded) {
  double worst = 0.0;
  constexpr int kPoints = 2000000;
  for (int i = 0; i <= kPoints; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / static_cast<float>(kPoints);  // [-87, 88]
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float got = exp_portable(x);
    const double ulp = static_cast<double>(std::nextafter(want, std::numeric_limits<float>::infinity()) - want);
    worst = std::max(worst, std::fabs(static_cast<double>(got) - static_cast<double>(want)) / ulp);
  }
  EXPECT_LE(worst, 1.0);
  EXPECT_EQ(exp_portable(0.0f), 1.0f);
  EXPECT_EQ(exp_portable(-0.0f), 1.0f);
  EXPECT_NEAR(exp_portable(1.0f), 2.7182817f, 3e-7f);
}

TEST(PortableExp, Edges) {
  EXPECT_EQ(exp_portable(-87.5f), 0.0f);
  EXPECT_EQ(exp_portable(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_portable(88.5f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_portable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GT(exp_portable(-86.9f), 0.0f);
  EXPECT_TRUE(std::isnormal(exp_portable(-87.0f)));
}

}  // namespace
}  // namespace kestrel
