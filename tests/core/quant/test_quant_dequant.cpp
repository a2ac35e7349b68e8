// Known-answer tests for dequantize_row: each block is built byte by byte from chosen scales and quants, and the
// expected floats come from the format's formula written out here (plus spot values worked out by hand), so a
// slip in the packing (get_scale_min_k4's high bits, Q6_K's halves, Q4_0's nibble order) cannot hide.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"

namespace kestrel {
namespace {

// Halves used as scales, written as bits so these tests do not lean on f32_to_fp16.
constexpr uint16_t kHalfQuarter = 0x3400;   // 0.25
constexpr uint16_t kHalfHalf = 0x3800;      // 0.5
constexpr uint16_t kHalfTwo = 0x4000;       // 2.0
constexpr uint16_t kHalfMinusTwo = 0xC000;  // -2.0

template <class Block>
std::vector<float> dequant(GgmlType type, const std::vector<Block>& blocks, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n), -12345.0f);
  const Status s = dequantize_row(type, blocks.data(), y.data(), n);
  EXPECT_TRUE(s) << s.error().to_string();
  return y;
}

TEST(DequantKnown, F32F16Bf16) {
  const std::array<float, 3> f32 = {1.5f, -0.0f, 3.0e38f};
  std::array<float, 3> y{};
  ASSERT_TRUE(dequantize_row(GgmlType::kF32, f32.data(), y.data(), 3));
  EXPECT_EQ(std::memcmp(f32.data(), y.data(), sizeof(y)), 0);

  const std::array<uint16_t, 5> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00};
  std::array<float, 5> yh{};
  ASSERT_TRUE(dequantize_row(GgmlType::kF16, f16.data(), yh.data(), 5));
  EXPECT_EQ(yh[0], 1.0f);
  EXPECT_EQ(yh[1], -2.0f);
  EXPECT_EQ(yh[2], 65504.0f);
  EXPECT_EQ(yh[3], 5.9604644775390625e-08f);  // 2^-24
  EXPECT_TRUE(std::isinf(yh[4]));

  const std::array<uint16_t, 3> bf = {0x3F80, 0xC040, 0x4049};
  std::array<float, 3> yb{};
  ASSERT_TRUE(dequantize_row(GgmlType::kBF16, bf.data(), yb.data(), 3));
  EXPECT_EQ(yb[0], 1.0f);
  EXPECT_EQ(yb[1], -3.0f);
  EXPECT_EQ(yb[2], 3.140625f);  // 0x40490000
}

TEST(DequantKnown, Q8_0) {
  // Block 0: d = 0.5, q[j] = j - 16 except q[0] = -128 and q[31] = 127. Block 1: d = -2, q[j] = 3 - j.
  std::vector<BlockQ8_0> blocks(2);
  blocks[0].d = kHalfHalf;
  blocks[1].d = kHalfMinusTwo;
  for (int j = 0; j < 32; ++j) {
    blocks[0].qs[j] = static_cast<int8_t>(j - 16);
    blocks[1].qs[j] = static_cast<int8_t>(3 - j);
  }
  blocks[0].qs[0] = -128;
  blocks[0].qs[31] = 127;
  const std::vector<float> y = dequant(GgmlType::kQ8_0, blocks, 64);
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[1], -7.5f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 63.5f);
  EXPECT_EQ(y[32], -6.0f);
  EXPECT_EQ(y[63], 56.0f);
  for (int j = 1; j < 31; ++j) EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 16)) << j;
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[32 + j], -2.0f * static_cast<float>(3 - j)) << j;
}

TEST(DequantKnown, Q4_0LowNibblesAreTheFirstHalf) {
  // d = -2. Byte j: low nibble j, high nibble 15 - j. Element j = (j - 8) * -2; element j + 16 = (7 - j) * -2.
  std::vector<BlockQ4_0> blocks(1);
  blocks[0].d = kHalfMinusTwo;
  for (int j = 0; j < 16; ++j) blocks[0].qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  EXPECT_EQ(blocks[0].qs[0], 0xF0);
  const std::vector<float> y = dequant(GgmlType::kQ4_0, blocks, 32);
  const std::array<float, 32> expected = {16,  14,  12,  10, 8,  6,  4,  2, 0, -2, -4, -6, -8, -10, -12, -14,
                                          -14, -12, -10, -8, -6, -4, -2, 0, 2, 4,  6,  8,  10, 12,  14,  16};
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], expected[j]) << j;
}

// Scales and mins chosen so that sub-blocks 4..7 need their top two bits (values >= 16), packed by hand below.
constexpr std::array<int, 8> kK4Scales = {1, 2, 3, 63, 17, 33, 50, 5};
constexpr std::array<int, 8> kK4Mins = {0, 4, 8, 12, 40, 1, 63, 20};
// bytes 0..3: scale[j] | (scale[j+4] >> 4) << 6; bytes 4..7: min[j] | (min[j+4] >> 4) << 6;
// bytes 8..11: (scale[j+4] & 15) | (min[j+4] & 15) << 4.
constexpr std::array<uint8_t, 12> kK4Packed = {0x41, 0x82, 0xC3, 0x3F, 0x80, 0x04, 0xC8, 0x4C, 0x81, 0x11, 0xF2, 0x45};

uint8_t k4_qs_byte(int i) { return static_cast<uint8_t>((i & 15) | (((i * 7 + 3) & 15) << 4)); }
uint8_t k5_qh_byte(int l) { return static_cast<uint8_t>(l * 37 + 11); }

// Element e of a Q4_K/Q5_K block from the chosen scales: chunk c = e / 64 holds sub-blocks 2c (low nibbles of
// qs[32c..32c+31]) and 2c + 1 (high nibbles); Q5_K adds 16 when bit (sub-block) of qh[e % 32] is set.
float k4_expected(int e, float d, float dmin, bool five_bit) {
  const int c = e / 64;
  const int l = e % 32;
  const bool low = (e % 64) < 32;
  const int sub = 2 * c + (low ? 0 : 1);
  const uint8_t byte = k4_qs_byte(32 * c + l);
  int q = low ? (byte & 15) : (byte >> 4);
  if (five_bit) q += 16 * ((k5_qh_byte(l) >> sub) & 1);
  return d * static_cast<float>(kK4Scales[sub]) * static_cast<float>(q) - dmin * static_cast<float>(kK4Mins[sub]);
}

TEST(DequantKnown, Q4_KScalesAndMinsWithHighBits) {
  std::vector<BlockQ4_K> blocks(2);
  for (int b = 0; b < 2; ++b) {
    blocks[b].d = b == 0 ? kHalfHalf : kHalfTwo;
    blocks[b].dmin = kHalfQuarter;
    std::memcpy(blocks[b].scales, kK4Packed.data(), 12);
    for (int i = 0; i < 128; ++i) blocks[b].qs[i] = k4_qs_byte(i);
  }
  const std::vector<float> y = dequant(GgmlType::kQ4_K, blocks, 512);
  // By hand (d = 0.5, dmin = 0.25): e = 0: sub 0, q 0 -> 0. e = 96: sub 3, q = qs[32] >> 4 = 3 -> 0.5*63*3 - 0.25*12.
  // e = 165: sub 5, q = qs[69] >> 4 = 6 -> 0.5*33*6 - 0.25*1. e = 202: sub 6, q = qs[106] & 15 = 10 ->
  // 0.5*50*10 - 0.25*63. e = 255: sub 7, q = qs[127] >> 4 = 12 -> 0.5*5*12 - 0.25*20.
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[96], 91.5f);
  EXPECT_EQ(y[165], 98.75f);
  EXPECT_EQ(y[202], 234.25f);
  EXPECT_EQ(y[255], 25.0f);
  EXPECT_EQ(y[256 + 255], 2.0f * 5 * 12 - 0.25f * 20);  // second block: d = 2
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], k4_expected(e, 0.5f, 0.25f, false)) << e;
    EXPECT_EQ(y[256 + e], k4_expected(e, 2.0f, 0.25f, false)) << e;
  }
}

TEST(DequantKnown, Q5_KHighBitsFromQh) {
  std::vector<BlockQ5_K> blocks(1);
  blocks[0].d = kHalfHalf;
  blocks[0].dmin = kHalfQuarter;
  std::memcpy(blocks[0].scales, kK4Packed.data(), 12);
  for (int i = 0; i < 128; ++i) blocks[0].qs[i] = k4_qs_byte(i);
  for (int l = 0; l < 32; ++l) blocks[0].qh[l] = k5_qh_byte(l);
  const std::vector<float> y = dequant(GgmlType::kQ5_K, blocks, 256);
  // By hand: e = 0: qh[0] = 11 has bit 0 -> q = 16 -> 0.5*1*16. e = 96: bit 3 of qh[0] set -> q = 19 ->
  // 0.5*63*19 - 3. e = 165: bit 5 of qh[5] = 196 clear -> as Q4_K. e = 202: bit 6 of qh[10] = 125 set -> q = 26 ->
  // 0.5*50*26 - 15.75. e = 255: bit 7 of qh[31] = 134 set -> q = 28 -> 0.5*5*28 - 5.
  EXPECT_EQ(y[0], 8.0f);
  EXPECT_EQ(y[96], 595.5f);
  EXPECT_EQ(y[165], 98.75f);
  EXPECT_EQ(y[202], 634.25f);
  EXPECT_EQ(y[255], 65.0f);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], k4_expected(e, 0.5f, 0.25f, true)) << e;
}

constexpr std::array<int8_t, 16> kQ6Scales = {1, -2, 3, -4, 5, -6, 7, -8, 127, -128, 10, -10, 64, -1, 2, 100};
uint8_t q6_ql_byte(int i) { return static_cast<uint8_t>(i * 13 + 5); }
uint8_t q6_qh_byte(int i) { return static_cast<uint8_t>(i * 71 + 3); }

// Element e of a Q6_K block: half h = e / 128, l = e % 32, group g = (e % 128) / 32. Groups 0/1 take the low
// nibble of ql[64h + l] / ql[64h + 32 + l], groups 2/3 the high nibble of the same bytes; the top two bits are
// bits 2g..2g+1 of qh[32h + l]; the scale is scales[8h + l/16 + 2g].
float q6_expected(int e, float d) {
  const int h = e / 128;
  const int l = e % 32;
  const int g = (e % 128) / 32;
  const uint8_t byte = q6_ql_byte(64 * h + l + ((g & 1) ? 32 : 0));
  const int low4 = g < 2 ? (byte & 15) : (byte >> 4);
  const int high2 = (q6_qh_byte(32 * h + l) >> (2 * g)) & 3;
  const int q = (low4 | (high2 << 4)) - 32;
  return d * static_cast<float>(kQ6Scales[8 * h + l / 16 + 2 * g]) * static_cast<float>(q);
}

TEST(DequantKnown, Q6_KBothHalves) {
  std::vector<BlockQ6_K> blocks(1);
  blocks[0].d = kHalfHalf;
  for (int i = 0; i < 128; ++i) blocks[0].ql[i] = q6_ql_byte(i);
  for (int i = 0; i < 64; ++i) blocks[0].qh[i] = q6_qh_byte(i);
  std::memcpy(blocks[0].scales, kQ6Scales.data(), 16);
  const std::vector<float> y = dequant(GgmlType::kQ6_K, blocks, 256);
  // By hand (d = 0.5), first half: e = 0: ql[0] = 5, qh[0] bits 0-1 = 3 -> q = 53 - 32 = 21, scale 1 -> 10.5.
  // e = 49: ql[49] = 0x82 low 2, qh[17] = 186 bits 2-3 = 2 -> q = 2, scale[3] = -4 -> -4.
  // e = 67: ql[3] = 0x2C high 2, qh[3] = 216 bits 4-5 = 1 -> q = -14, scale[4] = 5 -> -35.
  // e = 127: ql[63] = 0x38 high 3, qh[31] = 156 bits 6-7 = 2 -> q = 3, scale[7] = -8 -> -12.
  // Second half: e = 128: ql[64] = 0x45 low 5, qh[32] = 227 bits 0-1 = 3 -> q = 21, scale[8] = 127 -> 1333.5.
  // e = 165: ql[101] = 0x26 low 6, qh[37] = 70 bits 2-3 = 1 -> q = -10, scale[10] = 10 -> -50.
  // e = 208: ql[80] = 0x15 high 1, qh[48] = 83 bits 4-5 = 1 -> q = -15, scale[13] = -1 -> 7.5.
  // e = 244: ql[116] = 0xE9 high 14, qh[52] = 111 bits 6-7 = 1 -> q = -2, scale[15] = 100 -> -100.
  EXPECT_EQ(y[0], 10.5f);
  EXPECT_EQ(y[49], -4.0f);
  EXPECT_EQ(y[67], -35.0f);
  EXPECT_EQ(y[127], -12.0f);
  EXPECT_EQ(y[128], 1333.5f);
  EXPECT_EQ(y[165], -50.0f);
  EXPECT_EQ(y[208], 7.5f);
  EXPECT_EQ(y[244], -100.0f);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], q6_expected(e, 0.5f)) << e;
}

}  // namespace
}  // namespace kestrel
