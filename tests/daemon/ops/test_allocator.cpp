// The allocator settings: configure_allocator() applies the cap unless MALLOC_ARENA_MAX names one, and MemoryTrimmer
// trims on its period, starts nothing for a zero period and stops promptly.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "daemon/ops/allocator.h"

namespace kestrel::daemon::ops {
namespace {

using namespace std::chrono_literals;

// ASan replaces malloc and its mallopt refuses every setting (returns 0), so no cap is in force and configure_allocator
// says so. (TSan replaces malloc too, but its mallopt returns glibc's answer.)
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMalloptRefused = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMalloptRefused = true;
#else
constexpr bool kMalloptRefused = false;
#endif
#else
constexpr bool kMalloptRefused = false;
#endif

TEST(Allocator, CapUnlessTheEnvironmentNamesOne) {
  ::unsetenv("MALLOC_ARENA_MAX");
  EXPECT_EQ(configure_allocator(3), kMalloptRefused ? 0 : 3);
  EXPECT_EQ(configure_allocator(0), 0);
  ::setenv("MALLOC_ARENA_MAX", "5", 1);
  EXPECT_EQ(configure_allocator(3), 5) << "the operator's setting wins";
  ::unsetenv("MALLOC_ARENA_MAX");
}

TEST(Allocator, TrimmerRunsOnItsPeriodAndStops) {
  MemoryTrimmer trimmer(20ms);
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (trimmer.trims() < 3 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  EXPECT_GE(trimmer.trims(), 3u);
  const auto t0 = std::chrono::steady_clock::now();
  trimmer.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  const uint64_t after = trimmer.trims();
  std::this_thread::sleep_for(60ms);
  EXPECT_EQ(trimmer.trims(), after);

  MemoryTrimmer none(0ms);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(none.trims(), 0u);
}

}  // namespace
}  // namespace kestrel::daemon::ops
