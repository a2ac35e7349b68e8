// act_q8_quantize / act_q8k_quantize (cpu/act_q8.h): each 32-element block (256-element super-block) rounds to int8
// with d = max|x| / 127, so the largest element maps to ±127 and every element to within d/2 of its value, ties to
// even; the derived arrays (lane scales, negated lane sums, block sums; the 16-element sums) match the quants; an
// all-zero block is all zeros; only the asked vectors and forms are written; every instruction-set level writes the
// scalar level's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu/act_q8.h"
#include "cpu/isa.h"

namespace kestrel::cpu {
namespace {

TEST(ActQ8, BlocksRoundToWithinHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t n_in = 96, n_vec = 3;
  std::vector<float> x(static_cast<size_t>(n_in * n_vec));
  for (float& v : x) v = dist(rng);
  for (int i = 32; i < 64; ++i) x[static_cast<size_t>(n_in + i)] = 0.0f;  // vector 1, block 1: all zero
  x[5] = -1e6f;                                                           // an outlier: its block's step grows
  ActQ8Buffer buf;
  const ActQ8View q = buf.reserve(n_vec, n_in);
  act_q8_quantize(x.data(), n_in, 0, n_vec, buf);
  for (int64_t v = 0; v < n_vec; ++v) {
    for (int64_t b = 0; b < n_in / 32; ++b) {
      const int64_t first = v * n_in + b * 32;
      const float d = q.dl[first / 4];
      float amax = 0.0f;
      int32_t sum = 0, qmax = 0;
      for (int64_t i = first; i < first + 32; ++i) {
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
        EXPECT_LE(std::abs(q.q[i]), 127);
        EXPECT_LE(std::fabs(static_cast<float>(q.q[i]) * d - x[static_cast<size_t>(i)]), 0.5f * d * (1.0f + 1e-5f))
            << "vector " << v << " element " << i - v * n_in;
        sum += q.q[i];
        qmax = std::max(qmax, std::abs(static_cast<int32_t>(q.q[i])));
      }
      EXPECT_EQ(d, amax / 127.0f);
      EXPECT_EQ(qmax, amax > 0.0f ? 127 : 0);
      for (int64_t l = first / 4; l < first / 4 + 8; ++l) {
        EXPECT_EQ(q.dl[l], d);
        EXPECT_EQ(q.ns4[l], -(q.q[4 * l] + q.q[4 * l + 1] + q.q[4 * l + 2] + q.q[4 * l + 3]));
      }
      for (int64_t l = 0; l < 4; ++l) {
        int32_t s = 0;
        for (int64_t i = 0; i < 4; ++i) s += q.q[first + 4 * l + i] + q.q[first + 16 + 4 * l + i];
        EXPECT_EQ(q.nq[first / 8 + l], -8 * s) << "vector " << v << " block " << b << " lane " << l;
      }
      EXPECT_EQ(q.ds[first / 32], d * static_cast<float>(sum));
    }
  }
  EXPECT_EQ(q.q[n_in + 40], 0);
  EXPECT_EQ(q.dl[(n_in + 40) / 4], 0.0f);

  // Vectors [1, 2) only: vector 0 keeps what a first call wrote there.
  ActQ8Buffer part;
  const ActQ8View p = part.reserve(n_vec, n_in);
  for (int64_t i = 0; i < n_in; ++i) part.q()[i] = 9;
  act_q8_quantize(x.data(), n_in, 1, 2, part);
  EXPECT_EQ(p.q[0], 9);
  for (int64_t i = n_in; i < 2 * n_in; ++i) EXPECT_EQ(p.q[i], q.q[i]);
}

TEST(ActQ8, SuperBlocksRoundToWithinHalfAStep) {
  std::mt19937 rng(6);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t n_in = 768, n_vec = 2;
  std::vector<float> x(static_cast<size_t>(n_in * n_vec));
  for (float& v : x) v = dist(rng);
  for (int i = 256; i < 512; ++i) x[static_cast<size_t>(n_in + i)] = 0.0f;  // vector 1, super-block 1: all zero
  x[300] = 1e4f;                                                            // vector 0, super-block 1: an outlier
  ActQ8Buffer buf;
  const ActQ8View q = buf.reserve(n_vec, n_in, ActQ8Forms{false, true});
  EXPECT_EQ(q.q, nullptr) << "the per-32 form was not asked for";
  act_q8k_quantize(x.data(), n_in, 0, n_vec, buf);
  for (int64_t v = 0; v < n_vec; ++v) {
    for (int64_t b = 0; b < n_in / 256; ++b) {
      const int64_t first = v * n_in + b * 256;
      const float d = q.dk[first / 256];
      float amax = 0.0f;
      int32_t qmax = 0;
      for (int64_t i = first; i < first + 256; ++i) {
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
        EXPECT_LE(std::fabs(static_cast<float>(q.qk[i]) * d - x[static_cast<size_t>(i)]), 0.5f * d * (1.0f + 1e-5f))
            << "vector " << v << " element " << i - v * n_in;
        qmax = std::max(qmax, std::abs(static_cast<int32_t>(q.qk[i])));
      }
      EXPECT_EQ(d, amax / 127.0f);
      EXPECT_EQ(qmax, amax > 0.0f ? 127 : 0);
      for (int64_t g = first / 16; g < first / 16 + 16; ++g) {
        int32_t s = 0;
        for (int64_t i = 16 * g; i < 16 * g + 16; ++i) s += q.qk[i];
        EXPECT_EQ(q.bsum[g], s);
      }
    }
  }
  EXPECT_EQ(q.dk[n_in / 256 + 1], 0.0f);
  EXPECT_EQ(q.qk[n_in + 300], 0);

  // Both forms of the same vectors: each is what it is alone.
  ActQ8Buffer both;
  const ActQ8View b = both.reserve(n_vec, n_in, ActQ8Forms{true, true});
  act_q8_quantize(x.data(), n_in, 0, n_vec, both);
  act_q8k_quantize(x.data(), n_in, 0, n_vec, both);
  ActQ8Buffer per32;
  const ActQ8View p = per32.reserve(n_vec, n_in);
  act_q8_quantize(x.data(), n_in, 0, n_vec, per32);
  for (int64_t i = 0; i < n_in * n_vec; ++i) {
    ASSERT_EQ(b.qk[i], q.qk[i]) << i;
    ASSERT_EQ(b.q[i], p.q[i]) << i;
  }
}

// Ties round to even (cvtps2dq's rounding): a block whose largest value is 127 has d = 1, so x·(1/d) = x exactly.
TEST(ActQ8, TiesRoundToEven) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  const float halves[] = {0.5f, 1.5f, 2.5f, -2.5f, -3.5f, 126.5f, -0.5f};
  const int expect[] = {0, 2, 2, -2, -4, 126, 0};
  for (size_t i = 0; i < std::size(halves); ++i) x[1 + i] = halves[i];
  ActQ8Buffer buf;
  const ActQ8View q = buf.reserve(1, 32);
  act_q8_quantize(x.data(), 32, 0, 1, buf);
  EXPECT_EQ(q.dl[0], 1.0f);
  EXPECT_EQ(q.q[0], 127);
  for (size_t i = 0; i < std::size(halves); ++i) EXPECT_EQ(q.q[1 + i], expect[i]) << halves[i];
}

// Random blocks with the odd ones mixed in (all zero, an outlier, values far below and far above 1, exact ties, a
// single nonzero element), at block counts that are odd, even, one, and not a multiple of a vector pair.
TEST(ActQ8, EveryLevelWritesTheScalarBytes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (const int64_t n_in : {32, 96, 256, 768, 2048, 4352}) {
    const int64_t n_vec = 3;
    std::vector<float> x(static_cast<size_t>(n_in * n_vec));
    for (float& v : x) v = dist(rng);
    auto at = [&](int64_t i) -> float& { return x[static_cast<size_t>(i % (n_in * n_vec))]; };
    for (int64_t i = 0; i < 32; ++i) at(n_in + i) = 0.0f;                  // an all-zero block
    at(2 * n_in + 3) = -3e4f;                                              // an outlier
    for (int64_t i = 0; i < 32; ++i) at(n_in * n_vec - 32 + i) *= 1e-30f;  // tiny values
    for (int64_t i = 0; i < 16; ++i) at(n_in / 2 + i) *= 1e20f;            // huge ones
    at(64) = 127.0f;                                                       // ties in the block of 64..95
    for (int64_t i = 1; i < 8; ++i) at(64 + i) = static_cast<float>(i) - 3.5f;
    for (int64_t i = 0; i < 32; ++i) at(2 * n_in + 32 + i) = i == 7 ? -1.25f : 0.0f;  // one nonzero element
    const bool k = n_in % 256 == 0;
    ActQ8Buffer want;
    const ActQ8View w = want.reserve(n_vec, n_in, ActQ8Forms{true, k});
    act_q8_quantize(x.data(), n_in, 0, n_vec, want, Isa::kScalar);
    if (k) act_q8k_quantize(x.data(), n_in, 0, n_vec, want, Isa::kScalar);
    for (const Isa isa : kAllIsas) {
      if (!isa_supported(isa)) continue;
      ActQ8Buffer got;
      const ActQ8View g = got.reserve(n_vec, n_in, ActQ8Forms{true, k});
      act_q8_quantize(x.data(), n_in, 0, n_vec, got, isa);
      if (k) act_q8k_quantize(x.data(), n_in, 0, n_vec, got, isa);
      const std::string at_what = std::string(isa_name(isa)) + ", n_in " + std::to_string(n_in) + ", element ";
      const int64_t n = n_in * n_vec;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g.q[i], w.q[i]) << at_what << i;
      for (int64_t i = 0; i < n / 4; ++i) {
        ASSERT_EQ(g.dl[i], w.dl[i]) << at_what << 4 * i;
        ASSERT_EQ(g.ns4[i], w.ns4[i]) << at_what << 4 * i;
      }
      for (int64_t i = 0; i < n / 8; ++i) ASSERT_EQ(g.nq[i], w.nq[i]) << at_what << 8 * i;
      for (int64_t i = 0; i < n / 32; ++i) {
        ASSERT_EQ(g.ds[i], w.ds[i]) << at_what << 32 * i;
        ASSERT_EQ(g.d[i], w.d[i]) << at_what << 32 * i;
      }
      if (!k) continue;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g.qk[i], w.qk[i]) << at_what << i;
      for (int64_t i = 0; i < n / 256; ++i) ASSERT_EQ(g.dk[i], w.dk[i]) << at_what << 256 * i;
      for (int64_t i = 0; i < n / 16; ++i) ASSERT_EQ(g.bsum[i], w.bsum[i]) << at_what << 16 * i;
    }
  }
}

}  // namespace
}  // namespace kestrel::cpu
