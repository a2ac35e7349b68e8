// Rng: known-answer vectors for splitmix64 and xoshiro256** (the published reference generators' outputs, as
// other implementations also pin them), so the seeded stream can never change silently; next_double range;
// state save / restore.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/sampler/rng.h"

namespace kestrel {
namespace {

TEST(Rng, Splitmix64KnownAnswers) {
  uint64_t state = 0;
  EXPECT_EQ(splitmix64_next(&state), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(splitmix64_next(&state), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(splitmix64_next(&state), 0x06c45d188009454fULL);
}

TEST(Rng, Xoshiro256StarStarKnownAnswers) {
  Rng zero(0);
  EXPECT_EQ(zero.next_u64(), 0x99ec5f36cb75f2b4ULL);
  EXPECT_EQ(zero.next_u64(), 0xbf6e1f784956452aULL);
  EXPECT_EQ(zero.next_u64(), 0x1a5f849d4933e6e0ULL);
  EXPECT_EQ(zero.next_u64(), 0x6aa594f1262d2d2cULL);
  Rng one(1);
  EXPECT_EQ(one.next_u64(), 0xb3f2af6d0fc710c5ULL);
  EXPECT_EQ(one.next_u64(), 0x853b559647364ceaULL);
  Rng forty_two(42);
  EXPECT_EQ(forty_two.next_u64(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(forty_two.next_u64(), 0x6104d9866d113a7eULL);
}

TEST(Rng, NextDoubleIsTop53Bits) {
  Rng a(123);
  Rng b(123);
  for (int i = 0; i < 1000; ++i) {
    const double u = a.next_double();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u, static_cast<double>(b.next_u64() >> 11) / 9007199254740992.0);
  }
}

TEST(Rng, StateRoundTripsAndZeroStateIsRefused) {
  Rng a(99);
  a.next_u64();
  auto restored = Rng::from_state(a.state());
  ASSERT_TRUE(restored);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(restored->next_u64(), a.next_u64());
  auto zero = Rng::from_state(Rng::State{0, 0, 0, 0});
  ASSERT_FALSE(zero);
  EXPECT_EQ(zero.error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel
