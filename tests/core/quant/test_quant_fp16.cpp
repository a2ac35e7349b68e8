// fp16/bf16 conversions (core/quant/quant.h): hand-picked edge cases (subnormals, max, overflow, inf, NaN, ties
// to even), the round trip of every half, and, where the compiler has _Float16, agreement with its conversion.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "core/quant/quant.h"

namespace kestrel {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }
bool is_nan_half(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }

TEST(Fp16, DecodesNormalsSubnormalsAndSpecials) {
  EXPECT_EQ(fp16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_f32(0x3555), 0.333251953125f);           // 1 + 0x155/1024, times 2^-2
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.0f);                  // largest finite half
  EXPECT_EQ(fp16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(fp16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_f32(0x8201), -std::ldexp(513.0f, -24));  // negative subnormal
  EXPECT_EQ(bits_of(fp16_to_f32(0x0000)), 0x00000000u);
  EXPECT_EQ(bits_of(fp16_to_f32(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(fp16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  // NaN: payload moves up 13 bits and the result is quiet (as ggml's conversion gives on x86).
  EXPECT_EQ(bits_of(fp16_to_f32(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(bits_of(fp16_to_f32(0xFE00)), 0xFFC00000u);
  EXPECT_EQ(bits_of(fp16_to_f32(0x7C01)), 0x7FC02000u);  // signalling NaN comes out quiet
}

TEST(Fp16, EncodesWithRoundToNearestEven) {
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
  // 1 + 2^-11 is half-way between 1 (even) and 1 + 2^-10 (odd): goes to 1. 1 + 3*2^-11 is half-way between
  // 1 + 2^-10 (odd) and 1 + 2^-9 (even): goes up. Just above a tie rounds up.
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23)), 0x3C01);
  EXPECT_EQ(f32_to_fp16(2049.0f), 0x6800);  // tie between 2048 (even) and 2050
  EXPECT_EQ(f32_to_fp16(2051.0f), 0x6802);  // tie between 2050 (odd) and 2052
  // Top of the range: 65504 is the largest half; 65520 is the tie with 65536 (inf) and goes to inf.
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-1.0e6f), 0xFC00);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  // Subnormal halves: units of 2^-24, ties to even; 2^-25 is the tie with 0.
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 units -> 2
  EXPECT_EQ(f32_to_fp16(std::ldexp(5.0f, -25)), 0x0002);     // 2.5 units -> 2
  EXPECT_EQ(f32_to_fp16(-std::ldexp(7.0f, -25)), 0x8004);    // -3.5 units -> -4
  EXPECT_EQ(f32_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);  // 1023.5 units: rounds up into the smallest normal
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(f32_to_fp16(1.0e-30f), 0x0000);
  EXPECT_EQ(f32_to_fp16(float_of(0x00000001u)), 0x0000);  // f32 subnormal
  // NaN -> quiet NaN 0x7E00 with the sign (ggml's GGML_FP32_TO_FP16).
  EXPECT_EQ(f32_to_fp16(float_of(0x7FC00000u)), 0x7E00);
  EXPECT_EQ(f32_to_fp16(float_of(0xFF800001u)), 0xFE00);
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const uint16_t back = f32_to_fp16(fp16_to_f32(half));
    if (is_nan_half(half)) {
      ASSERT_TRUE(is_nan_half(back)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, half & 0x8000) << std::hex << h;
    } else {
      ASSERT_EQ(back, half) << std::hex << h;
    }
  }
}

#if defined(__FLT16_MAX__)
// GCC/Clang's _Float16 conversion (libgcc's soft-float or F16C) is an independent IEEE round-to-nearest-even.
TEST(Fp16, MatchesCompilerFloat16OnRandomBits) {
  std::mt19937 rng(20240611);
  for (int i = 0; i < 200000; ++i) {
    const float f = float_of(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const auto ref = static_cast<_Float16>(f);
    uint16_t ref_bits = 0;
    std::memcpy(&ref_bits, &ref, sizeof(ref_bits));
    ASSERT_EQ(f32_to_fp16(f), ref_bits) << std::hex << bits_of(f);
  }
  // Dense sweep of the region where half subnormals and normals meet.
  for (uint32_t u = 0x33000000u; u < 0x39000000u; u += 37) {
    const auto ref = static_cast<_Float16>(float_of(u));
    uint16_t ref_bits = 0;
    std::memcpy(&ref_bits, &ref, sizeof(ref_bits));
    ASSERT_EQ(f32_to_fp16(float_of(u)), ref_bits) << std::hex << u;
  }
}
#endif

TEST(Bf16, DecodesTopHalfOfF32) {
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
  EXPECT_EQ(bf16_to_f32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_of(bf16_to_f32(0x0001)), 0x00010000u);  // a subnormal f32 stays subnormal
  EXPECT_EQ(bits_of(bf16_to_f32(0x7FC1)), 0x7FC10000u);
  EXPECT_EQ(bits_of(bf16_to_f32(0x8000)), 0x80000000u);
}

TEST(Bf16, EncodesWithRoundToNearestEvenAndQuietNaN) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-3.0f), 0xC040);
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 ties to 1; 1 + 3*2^-8 ties up to 1 + 2^-6; above a tie goes up.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -23)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16 to inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // f32 subnormals are rounded, not flushed: 0x8000 is the tie with 0, 0x18000 the tie between 1 and 2.
  EXPECT_EQ(f32_to_bf16(float_of(0x00008000u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(float_of(0x00018000u)), 0x0002);
  EXPECT_EQ(f32_to_bf16(float_of(0x00008001u)), 0x0001);
  // NaN keeps its top bits and is made quiet; a NaN whose payload sits only in the low bits does not become inf.
  EXPECT_EQ(f32_to_bf16(float_of(0x7FC00000u)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F810000u)), 0x7FC1);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(float_of(0xFF800001u)), 0xFFC0);
}

TEST(Bf16, EveryNonNaNBf16RoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto b = static_cast<uint16_t>(h);
    const float f = bf16_to_f32(b);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), b) << std::hex << h;
  }
}

}  // namespace
}  // namespace kestrel
