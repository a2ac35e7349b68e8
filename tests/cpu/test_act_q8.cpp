// act_q8_quantize / act_q8k_quantize (cpu/act_q8.h): each 32-element block (256-element super-block) rounds to int8
// with d = max|x| / 127, so the largest element maps to ±127 and every element to within d/2 of its value, ties to
// even; the derived arrays (lane scales, negated lane sums, block sums; the 16-element sums) match the quants; an
// all-zero block is all zeros; only the asked vectors and forms are written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu/act_q8.h"

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

}  // namespace
}  // namespace kestrel::cpu
