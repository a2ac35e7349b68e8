// The CPU attention kernels (cpu/attend.h) at every instruction-set level this CPU has, against ref::attend_head on
// caches of 2 kv heads filled with random K/V: head_dim 256 (the 35B-A3B presets'), 32 (the golden models'), 40 (a
// multiple of 8 but not 16: avx2's kernel, the scalar one at avx512) and 20 (scalar everywhere), 1, 2, 17, 64 and 300
// positions. The scalar kernel is the reference's arithmetic: bit-identical. The SIMD kernels sum in other orders:
// max|Δ| ≤ 1e-5 · max|V| (the output is a convex combination of V rows; score errors of a few ulps from the lane
// order move it by ~1e-7 of that), far below what a wrong head, position or scale gives (O(1)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/reference/attention.h"
#include "core/reference/kv_cache.h"
#include "cpu/attend.h"
#include "cpu/isa.h"

namespace kestrel::cpu {
namespace {

class AttendTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << "; that level is tested on a machine that has it";
    }
  }
};

TEST_P(AttendTest, MatchesTheReference) {
  const Isa isa = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const int hd : {256, 32, 40, 20}) {
    const int n_kv = 2;
    auto cache = ref::KvCache::make(300, n_kv, hd);
    ASSERT_TRUE(cache.has_value());
    std::vector<float> k(static_cast<size_t>(n_kv * hd)), v(k.size());
    float vmax = 0.0f;
    for (int t = 0; t < 300; ++t) {
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng), vmax = std::max(vmax, std::fabs(x));
      ASSERT_TRUE(cache->append(k.data(), v.data()));
    }
    const AttendFn fn = attend_kernel(isa, hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const int n_pos : {1, 2, 17, 64, 300}) {
      for (int head = 0; head < n_kv; ++head) {
        std::vector<float> q(static_cast<size_t>(hd)), want(q.size()), got(q.size(), NAN);
        for (float& x : q) x = nd(rng);
        ref::attend_head(*cache, head, n_pos, q.data(), scale, want.data());
        fn(*cache, head, n_pos, q.data(), scale, got.data());
        const std::string what = std::string(isa_name(isa)) + " head_dim " + std::to_string(hd) + " positions " +
                                 std::to_string(n_pos) + " kv head " + std::to_string(head);
        const bool scalar = fn == attend_kernel(Isa::kScalar, hd);
        if (scalar) {
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << what << ": the scalar kernel's bits";
          continue;
        }
        double worst = 0.0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double d = std::fabs(double(got[i]) - double(want[i]));
          worst = std::isnan(d) ? INFINITY : std::max(worst, d);
        }
        EXPECT_LE(worst, 1e-5 * vmax) << what;
        // A second call gives the same bits (no state carried between calls).
        std::vector<float> again(q.size(), NAN);
        fn(*cache, head, n_pos, q.data(), scale, again.data());
        EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * 4), 0) << what << ": a repeated call";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, AttendTest, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_name(i.param)); });

}  // namespace
}  // namespace kestrel::cpu
