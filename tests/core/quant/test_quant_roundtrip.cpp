// quantize_row -> dequantize_row error bounds per type, the quantizers' known answers where Kestrel follows ggml's
// reference bit for bit (Q8_0, Q4_0), odd rows (all zero, constant, one outlier, tiny values), and the errors
// (n not a multiple of the block, unsupported types, NaN/inf, values too large for the f16 scales).
//
// Error measure: relative RMS, sqrt(sum (y - x)^2 / sum x^2), over rows of 4096. Measured with this code on
// gaussian rows (20 seeds, mean / worst): f16 2.1e-4 / 2.1e-4, bf16 1.66e-3 / 1.70e-3, q8_0 5.35e-3 / 5.50e-3,
// q4_0 8.59e-2 / 8.75e-2, q4_K 7.18e-2 / 7.33e-2, q5_K 3.59e-2 / 3.69e-2, q6_K 1.78e-2 / 1.81e-2 (ggml's own
// reference quantizers give 6.5e-2, 3.3e-2 and 1.75e-2 for the K-quants on the same kind of data). The bounds
// below sit ~15-25% above the worst case seen.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"

namespace kestrel {
namespace {

struct Bound {
  GgmlType type;
  double gaussian;  // relative RMS on N(0, 1) rows, also after scaling by 1e-3 and 1e3
  double outlier;   // relative RMS on a gaussian row with one element of 50
  double constant;  // largest relative error of one element on constant rows
};

constexpr Bound kBounds[] = {
    {GgmlType::kF32, 0.0, 0.0, 0.0},           {GgmlType::kF16, 3.0e-4, 3.0e-4, 1.0e-3},
    {GgmlType::kBF16, 2.2e-3, 2.2e-3, 4.0e-3},  // bf16's half-ulp is at most 2^-8 relative
    {GgmlType::kQ8_0, 6.5e-3, 1.1e-2, 1.0e-3}, {GgmlType::kQ4_0, 0.100, 0.130, 1.0e-3},
    {GgmlType::kQ4_K, 0.085, 0.110, 1.0e-3},   {GgmlType::kQ5_K, 0.043, 0.055, 1.0e-3},
    {GgmlType::kQ6_K, 0.021, 0.032, 1.0e-3},
};

constexpr int64_t kN = 4096;

std::string name_of(GgmlType t) { return std::string(ggml_type_name(t)); }

std::vector<float> gaussian_row(uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kN);
  for (float& v : x) v = scale * dist(rng);
  return x;
}

// Quantizes and dequantizes x; fails the test on an error.
std::vector<float> round_trip(GgmlType type, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  const Expected<uint64_t> bytes = ggml_row_bytes(type, static_cast<uint64_t>(n));
  EXPECT_TRUE(bytes);
  std::vector<unsigned char> q(bytes ? *bytes : 0);
  std::vector<float> y(x.size(), std::nanf(""));
  const Status qs = quantize_row(type, x.data(), q.data(), n);
  EXPECT_TRUE(qs) << name_of(type) << ": " << qs.error().to_string();
  const Status ds = dequantize_row(type, q.data(), y.data(), n);
  EXPECT_TRUE(ds) << name_of(type) << ": " << ds.error().to_string();
  return y;
}

double relative_rms(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0.0;
  double ref = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(y[i]) - x[i];
    err += d * d;
    ref += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

TEST(QuantRoundTrip, GaussianRowsWithinBounds) {
  for (const Bound& b : kBounds) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      for (float scale : {1.0f, 1.0e-3f, 1.0e3f}) {
        const std::vector<float> x = gaussian_row(seed, scale);
        const double r = relative_rms(x, round_trip(b.type, x));
        EXPECT_LE(r, b.gaussian) << name_of(b.type) << " seed " << seed << " scale " << scale;
        if (b.type != GgmlType::kF32) {
          EXPECT_GT(r, 0.0) << name_of(b.type);  // a lossy format that reproduces everything exactly is suspicious
        }
      }
    }
  }
}

TEST(QuantRoundTrip, AllZeroRowStaysZero) {
  const std::vector<float> x(kN, 0.0f);
  for (const Bound& b : kBounds) {
    const std::vector<float> y = round_trip(b.type, x);
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(y[i], 0.0f) << name_of(b.type) << " at " << i;
  }
}

TEST(QuantRoundTrip, ConstantRows) {
  for (const Bound& b : kBounds) {
    for (float c : {0.7f, -1.3f, 1000.0f, -3.0e-3f}) {
      const std::vector<float> x(kN, c);
      const std::vector<float> y = round_trip(b.type, x);
      for (int64_t i = 0; i < kN; ++i) {
        ASSERT_LE(std::fabs(y[i] - c), b.constant * std::fabs(c)) << name_of(b.type) << " c " << c << " at " << i;
      }
    }
  }
}

TEST(QuantRoundTrip, OneOutlier) {
  std::vector<float> x = gaussian_row(7, 1.0f);
  constexpr int64_t kAt = 1000;  // inside the 4th super-block, 2nd sub-block
  x[kAt] = 50.0f;
  for (const Bound& b : kBounds) {
    const std::vector<float> y = round_trip(b.type, x);
    EXPECT_LE(relative_rms(x, y), b.outlier) << name_of(b.type);
    // The outlier itself sets its block's scale, so it comes back to within a few percent.
    EXPECT_NEAR(y[kAt], 50.0f, 50.0f * 0.04f) << name_of(b.type);
  }
}

TEST(QuantRoundTrip, TinyValues) {
  const std::vector<float> x = gaussian_row(11, 1.0e-30f);
  for (const Bound& b : kBounds) {
    const std::vector<float> y = round_trip(b.type, x);
    if (b.type == GgmlType::kF32 || b.type == GgmlType::kBF16) {
      // Same exponent range as f32: the relative error is the format's own.
      EXPECT_LE(relative_rms(x, y), b.gaussian) << name_of(b.type);
    } else {
      // Below the smallest f16 (5.96e-8), a value or block scale of 1e-30 rounds to zero: the row comes back as
      // zeros (never NaN/inf or garbage).
      for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(y[i], 0.0f) << name_of(b.type) << " at " << i;
    }
  }
}

TEST(QuantRoundTrip, KQuantsSeeEveryScaleSlot) {
  // Sub-blocks of very different magnitude give sub-block scales spanning the 6-bit range, including slots 4..7
  // whose top bits live elsewhere in the packed bytes: a packing slip shows up as a large error.
  std::vector<float> x = gaussian_row(5, 1.0f);
  for (int64_t i = 0; i < kN; ++i) x[i] *= 0.05f + static_cast<float>((i / 32) % 8);
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K}) {
    const double bound = t == GgmlType::kQ4_K ? 0.085 : 0.043;
    EXPECT_LE(relative_rms(x, round_trip(t, x)), bound) << name_of(t);
  }
  for (int64_t i = 0; i < kN; ++i) x[i] *= (i / 16) % 2 == 0 ? 1.0f : -0.03f;  // Q6_K: scales of both signs
  EXPECT_LE(relative_rms(x, round_trip(GgmlType::kQ6_K, x)), 0.021);
}

// ---- quantizers that are ggml's reference, byte for byte --------------------------------------------------------

TEST(QuantKnown, Q8_0RoundsHalfAwayFromZero) {
  // max |x| = 127, so d = 1 and q = round(x) with ties away from zero.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = -0.5f;
  x[5] = 1.49f;
  x[6] = -126.5f;
  x[7] = 3.0f;
  BlockQ8_0 blk;
  ASSERT_TRUE(quantize_row(GgmlType::kQ8_0, x.data(), &blk, 32));
  EXPECT_EQ(blk.d, 0x3C00);
  const int expected[8] = {127, 3, -3, 1, -1, 1, -127, 3};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(blk.qs[j], expected[j]) << j;
  for (int j = 8; j < 32; ++j) EXPECT_EQ(blk.qs[j], 0) << j;
}

TEST(QuantKnown, Q4_0TakesTheFirstLargestMagnitudeAsMinusEight) {
  // x[0] = -8 is the first element of largest magnitude: d = -8 / -8 = 1, q = min(15, trunc(x + 8.5)).
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;
  x[1] = 8.0f;    // 16.5 -> 16 -> clamped to 15
  x[2] = 0.5f;    // 9.0 -> 9
  x[3] = -0.5f;   // 8.0 -> 8
  x[4] = 1.49f;   // 9.99 -> 9
  x[5] = -7.5f;   // 1.0 -> 1
  x[16] = 7.0f;   // 15.5 -> 15 (high nibble of byte 0)
  x[17] = -3.0f;  // 5.5 -> 5
  BlockQ4_0 blk;
  ASSERT_TRUE(quantize_row(GgmlType::kQ4_0, x.data(), &blk, 32));
  EXPECT_EQ(blk.d, 0x3C00);
  EXPECT_EQ(blk.qs[0], 0xF0);  // low: q(x[0]) = 0, high: q(x[16]) = 15
  EXPECT_EQ(blk.qs[1], 0x5F);  // low: 15, high: 5
  EXPECT_EQ(blk.qs[2], 0x89);
  EXPECT_EQ(blk.qs[3], 0x88);
  EXPECT_EQ(blk.qs[4], 0x89);
  EXPECT_EQ(blk.qs[5], 0x81);
  EXPECT_EQ(blk.qs[6], 0x88);  // zeros: 8.5 -> 8

  // The same magnitudes in the other order: the first is now +8, so d = -1.
  std::swap(x[0], x[1]);
  ASSERT_TRUE(quantize_row(GgmlType::kQ4_0, x.data(), &blk, 32));
  EXPECT_EQ(blk.d, 0xBC00);
  EXPECT_EQ(blk.qs[0] & 0x0F, 0);   // 8 * -1 + 8.5 = 0.5 -> 0
  EXPECT_EQ(blk.qs[1] & 0x0F, 15);  // -8 * -1 + 8.5 = 16.5 -> 15
}

// ---- errors -------------------------------------------------------------------------------------------------------

TEST(QuantErrors, LengthNotAMultipleOfTheBlock) {
  std::vector<float> x(1024, 1.0f);
  std::vector<unsigned char> q(4096);
  const struct {
    GgmlType type;
    int64_t n;
  } cases[] = {{GgmlType::kQ4_K, 100},
               {GgmlType::kQ5_K, 257},
               {GgmlType::kQ6_K, 512 + 16},
               {GgmlType::kQ8_0, 33},
               {GgmlType::kQ4_0, 16}};
  for (const auto& c : cases) {
    const Status qs = quantize_row(c.type, x.data(), q.data(), c.n);
    ASSERT_FALSE(qs) << name_of(c.type);
    EXPECT_EQ(qs.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(qs.error().message.find("multiple"), std::string::npos) << qs.error().message;
    const Status ds = dequantize_row(c.type, q.data(), x.data(), c.n);
    ASSERT_FALSE(ds) << name_of(c.type);
    EXPECT_EQ(ds.error().code, ErrorCode::kInvalidArgument);
  }
  EXPECT_TRUE(quantize_row(GgmlType::kF16, x.data(), q.data(), 3));  // plain types take any length
}

TEST(QuantErrors, UnsupportedTypes) {
  std::vector<float> x(256, 1.0f);
  std::vector<unsigned char> q(4096);
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ8_K,
                     GgmlType::kIQ2_XXS, GgmlType::kIQ4_XS, GgmlType::kI8, GgmlType::kI32, GgmlType::kF64,
                     GgmlType::kMXFP4, static_cast<GgmlType>(99)}) {
    EXPECT_FALSE(quant_can_dequantize(t));
    EXPECT_FALSE(quant_can_quantize(t));
    const Status ds = dequantize_row(t, q.data(), x.data(), 256);
    ASSERT_FALSE(ds);
    EXPECT_EQ(ds.error().code, ErrorCode::kUnsupported);
    EXPECT_NE(ds.error().message.find("q4_K"), std::string::npos) << ds.error().message;  // lists what works
    const Status qs = quantize_row(t, x.data(), q.data(), 256);
    ASSERT_FALSE(qs);
    EXPECT_EQ(qs.error().code, ErrorCode::kUnsupported);
  }
  for (const Bound& b : kBounds) {
    EXPECT_TRUE(quant_can_dequantize(b.type)) << name_of(b.type);
    EXPECT_TRUE(quant_can_quantize(b.type)) << name_of(b.type);
  }
}

TEST(QuantErrors, BadCountsAndPointers) {
  std::vector<float> x(256, 1.0f);
  std::vector<unsigned char> q(4096);
  const Status neg = dequantize_row(GgmlType::kF32, q.data(), x.data(), -32);
  ASSERT_FALSE(neg);
  EXPECT_EQ(neg.error().code, ErrorCode::kInvalidArgument);
  const Status null_src = dequantize_row(GgmlType::kQ8_0, nullptr, x.data(), 32);
  ASSERT_FALSE(null_src);
  EXPECT_EQ(null_src.error().code, ErrorCode::kInvalidArgument);
  const Status null_dst = quantize_row(GgmlType::kQ4_K, x.data(), nullptr, 256);
  ASSERT_FALSE(null_dst);
  EXPECT_EQ(null_dst.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(quantize_row(GgmlType::kQ4_K, nullptr, nullptr, 0));  // nothing to do
  EXPECT_TRUE(dequantize_row(GgmlType::kQ6_K, nullptr, nullptr, 0));
}

TEST(QuantErrors, NonFiniteInputOnlyForPlainTypes) {
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> x(256, 0.5f);
    x[77] = bad;
    std::vector<unsigned char> q(4096);
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
      const Status s = quantize_row(t, x.data(), q.data(), 256);
      ASSERT_FALSE(s) << name_of(t);
      EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
      EXPECT_NE(s.error().message.find("element 77"), std::string::npos) << s.error().message;
    }
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
      std::vector<float> y(256);
      ASSERT_TRUE(quantize_row(t, x.data(), q.data(), 256)) << name_of(t);
      ASSERT_TRUE(dequantize_row(t, q.data(), y.data(), 256));
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(y[77])) << name_of(t);
      } else {
        EXPECT_EQ(y[77], bad) << name_of(t);
      }
    }
  }
}

TEST(QuantErrors, ValuesTooLargeForTheF16Scale) {
  std::vector<float> x(256, 0.25f);
  x[3] = 1.0e9f;
  std::vector<float> extreme(256, 1.0f);  // a range that overflows f32 itself
  extreme[40] = 3.0e38f;
  extreme[41] = -3.0e38f;
  std::vector<unsigned char> q(4096);
  for (const std::vector<float>* row : {&x, &extreme}) {
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
      const Status s = quantize_row(t, row->data(), q.data(), 256);
      ASSERT_FALSE(s) << name_of(t);
      EXPECT_EQ(s.error().code, ErrorCode::kOutOfRange) << name_of(t);
    }
  }
}

}  // namespace
}  // namespace kestrel
