// gpu/argmax_rows against core/sampler's argmax_lowest (the greedy rule): random rows of odd lengths (1, 5, 1023,
// 1025, 248320), several rows per call; ties (the maximum repeated at scattered indices, across threads and warps)
// resolve to the lowest index; NaN never chosen; +inf wins; an all -inf/NaN row gives 0. Exact (no tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/sampler/logit_scan.h"
#include "gpu/kernels/argmax.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Runs argmax_rows on `rows` rows of n values and compares each row with argmax_lowest.
void check_rows(const std::vector<float>& logits, int64_t rows, int64_t n, const std::string& what) {
  DeviceBuffer dl(logits.size() * 4), di(static_cast<size_t>(rows) * 4);
  ASSERT_TRUE(test::upload(dl, logits));
  const auto st = argmax_rows(dl.as<float>(), rows, n, di.as<int32_t>(), nullptr);
  ASSERT_TRUE(st) << st.error().to_string();
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  const auto got = test::download<int32_t>(di.as(), static_cast<size_t>(rows));
  ASSERT_EQ(got.size(), static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<const float> row(logits.data() + r * n, static_cast<size_t>(n));
    const int32_t want = argmax_lowest(row);
    const int32_t g = got[static_cast<size_t>(r)];
    const std::string got_value = (g >= 0 && g < n) ? std::to_string(row[static_cast<size_t>(g)]) : "out of range";
    EXPECT_EQ(g, want) << what << ": row " << r << " of " << rows << " (n " << n << "): got id " << g << " ("
                       << got_value << "), want " << want << " (" << row[static_cast<size_t>(want)] << ")";
  }
  // Run again: identical.
  ASSERT_TRUE(argmax_rows(dl.as<float>(), rows, n, di.as<int32_t>(), nullptr));
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(test::download<int32_t>(di.as(), static_cast<size_t>(rows)) == got) << what << ": second run differs";
}

TEST(Argmax, RandomRowsOfOddLengths) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 3.0f);
  for (int64_t n : {1, 5, 1023, 1025, 248320}) {
    const int64_t rows = n > 100000 ? 3 : 7;
    std::vector<float> l(static_cast<size_t>(rows * n));
    for (float& x : l) x = g(rng);
    check_rows(l, rows, n, "random n " + std::to_string(n));
  }
}

TEST(Argmax, TiesGoToTheLowestIndex) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> small(-8, 8);  // many equal values
  const int64_t n = 50000, rows = 6;
  std::vector<float> l(static_cast<size_t>(rows * n));
  for (float& x : l) x = static_cast<float>(small(rng));
  // Row 1: the maximum at a high index and at indices handled by different threads and warps.
  float* r1 = l.data() + n;
  for (int64_t i : {40000, 33000, 1025, 7777, 4096}) r1[i] = 100.0f;
  // Row 2: the maximum only at the very end and the very beginning.
  float* r2 = l.data() + 2 * n;
  r2[n - 1] = 50.0f;
  r2[0] = 50.0f;
  // Row 3: NaNs everywhere except a few ordinary values; NaN is never chosen.
  float* r3 = l.data() + 3 * n;
  for (int64_t i = 0; i < n; ++i) r3[i] = (i % 3 == 0) ? static_cast<float>(i % 17) : kNaN;
  // Row 4: +inf twice.
  float* r4 = l.data() + 4 * n;
  r4[30000] = kInf;
  r4[2000] = kInf;
  // Row 5: nothing above -inf (NaN and -inf) -> 0.
  float* r5 = l.data() + 5 * n;
  for (int64_t i = 0; i < n; ++i) r5[i] = (i % 2) ? -kInf : kNaN;
  check_rows(l, rows, n, "ties");
  // The expectations themselves, as a guard on the comparison above.
  EXPECT_EQ(argmax_lowest(std::span<const float>(r1, static_cast<size_t>(n))), 1025);
  EXPECT_EQ(argmax_lowest(std::span<const float>(r2, static_cast<size_t>(n))), 0);
  EXPECT_EQ(argmax_lowest(std::span<const float>(r4, static_cast<size_t>(n))), 2000);
  EXPECT_EQ(argmax_lowest(std::span<const float>(r5, static_cast<size_t>(n))), 0);
}

TEST(Argmax, ArgumentErrors) {
  float* p = reinterpret_cast<float*>(uintptr_t{256});
  int32_t* ids = reinterpret_cast<int32_t*>(uintptr_t{512});
  EXPECT_EQ(argmax_rows(p, 1, 0, ids, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(argmax_rows(nullptr, 1, 4, ids, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(argmax_rows(p, 1, 4, nullptr, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(argmax_rows(p, -1, 4, ids, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(argmax_rows(p, 0, 4, ids, nullptr));  // nothing to do, nothing launched
}

}  // namespace
}  // namespace kestrel::gpu
