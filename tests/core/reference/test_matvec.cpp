// core/reference matvec: F32 and Q8_0 weights against an explicit dequantize-and-dot written here, batch invariance,
// expert slicing and the errors a caller can hit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/quant/blocks.h"
#include "core/reference/matvec.h"
#include "tests/core/reference/ref_test_util.h"

namespace kestrel::ref {
namespace {

using test::F32Weights;
using test::random_vec;

// IEEE half → float for normal numbers and zero, written independently of core/quant.
float half_to_float(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (exp == 0 && mant == 0) return sign * 0.0f;
  return sign * std::ldexp(1.0f + static_cast<float>(mant) / 1024.0f, exp - 15);
}

// Random Q8_0 rows: n_out rows of n_in/32 blocks with random scales and int8 quants.
std::vector<uint8_t> random_q8_0(uint64_t n_in, uint64_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(static_cast<size_t>(n_out * (n_in / kQK8_0)) * sizeof(BlockQ8_0));
  auto* blocks = reinterpret_cast<BlockQ8_0*>(bytes.data());
  for (size_t b = 0; b < n_out * (n_in / kQK8_0); ++b) {
    // Normal halves with exponent 8..14 (scales 2^-7 .. 2^-1 times 1.mantissa).
    blocks[b].d = static_cast<uint16_t>(((8 + rng() % 7) << 10) | (rng() & 0x3ff));
    for (int i = 0; i < kQK8_0; ++i) blocks[b].qs[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  }
  return bytes;
}

TEST(RefMatvec, F32MatchesExplicitDot) {
  const F32Weights w(37, 11, 1);
  const auto x = random_vec(37, 2);
  std::vector<float> y(11);
  ASSERT_TRUE(matvec(w.view(), x.data(), y.data()));
  for (uint64_t o = 0; o < 11; ++o) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < 37; ++i) acc += w.at(o, i) * x[i];
    EXPECT_EQ(y[o], acc) << "row " << o;
  }
}

TEST(RefMatvec, Q8_0MatchesExplicitDequantizeAndDot) {
  const uint64_t n_in = 96, n_out = 7;
  const auto bytes = random_q8_0(n_in, n_out, 3);
  const QuantMatrix w{GgmlType::kQ8_0, bytes.data(), n_in, n_out};
  const auto x = random_vec(n_in, 4);
  std::vector<float> y(n_out);
  ASSERT_TRUE(matvec(w, x.data(), y.data()));
  const auto* blocks = reinterpret_cast<const BlockQ8_0*>(bytes.data());
  for (uint64_t o = 0; o < n_out; ++o) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n_in; ++i) {
      const BlockQ8_0& blk = blocks[o * (n_in / kQK8_0) + i / kQK8_0];
      acc += static_cast<float>(blk.qs[i % kQK8_0]) * half_to_float(blk.d) * x[i];
    }
    EXPECT_EQ(y[o], acc) << "row " << o;
  }
}

TEST(RefMatvec, BatchIsBitIdenticalToSingleToken) {
  const auto bytes = random_q8_0(64, 9, 5);
  const QuantMatrix w{GgmlType::kQ8_0, bytes.data(), 64, 9};
  const int n_tok = 5;
  const auto x = random_vec(64 * n_tok, 6);
  std::vector<float> batch(9 * n_tok), single(9);
  ASSERT_TRUE(matvec_batch(w, x.data(), n_tok, batch.data()));
  for (int t = 0; t < n_tok; ++t) {
    ASSERT_TRUE(matvec(w, x.data() + t * 64, single.data()));
    for (int o = 0; o < 9; ++o) EXPECT_EQ(batch[t * 9 + o], single[o]);
  }
}

TEST(RefMatvec, ExpertMatrixSlicesTheStack) {
  const uint64_t n_in = 32, n_out = 3, n_exp = 4;
  const auto bytes = random_q8_0(n_in, n_out * n_exp, 7);
  const QuantExperts stack{GgmlType::kQ8_0, bytes.data(), n_in, n_out, n_exp};
  const auto x = random_vec(n_in, 8);
  // The whole stack seen as one {n_in, n_out·E} matrix: expert e owns rows [e·n_out, (e+1)·n_out).
  std::vector<float> all(n_out * n_exp), one(n_out);
  ASSERT_TRUE(matvec(QuantMatrix{GgmlType::kQ8_0, bytes.data(), n_in, n_out * n_exp}, x.data(), all.data()));
  for (uint64_t e = 0; e < n_exp; ++e) {
    auto m = expert_matrix(stack, e);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->data, bytes.data() + e * n_out * sizeof(BlockQ8_0));
    ASSERT_TRUE(matvec(*m, x.data(), one.data()));
    for (uint64_t o = 0; o < n_out; ++o) EXPECT_EQ(one[o], all[e * n_out + o]);
  }
  auto bad = expert_matrix(stack, n_exp);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kOutOfRange);
}

TEST(RefMatvec, Errors) {
  const auto x = random_vec(40, 9);
  std::vector<float> y(2);
  const auto bytes = random_q8_0(64, 2, 10);
  // 40 is not a multiple of the Q8_0 block of 32.
  auto s = matvec(QuantMatrix{GgmlType::kQ8_0, bytes.data(), 40, 2}, x.data(), y.data());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  // A type core/quant cannot dequantize.
  s = matvec(QuantMatrix{GgmlType::kIQ2_XXS, bytes.data(), 256, 1}, x.data(), y.data());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);
  // Missing data.
  s = matvec(QuantMatrix{GgmlType::kF32, nullptr, 4, 2}, x.data(), y.data());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  // Shape check names the tensor.
  const F32Weights w(4, 2, 11);
  s = check_matrix(w.view(), "attn_q", 4, 3);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("attn_q"), std::string::npos);
  EXPECT_TRUE(check_matrix(w.view(), "attn_q", 4, 2));
}

}  // namespace
}  // namespace kestrel::ref
