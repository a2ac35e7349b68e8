// IEEE binary16 and bfloat16 conversions, and the F32/F16/BF16 "row formats" built on them.
//
// fp16 -> f32 is exact (every half is an f32); a NaN keeps its payload and comes out quiet, as ggml's
// GGML_FP16_TO_FP32 gives on x86. f32 -> fp16 rounds to nearest, ties to even, with half subnormals, overflow to
// inf, and NaN -> a quiet NaN 0x7E00 with the input's sign (ggml's GGML_FP32_TO_FP16). bf16 is the top half of an
// f32: f32 -> bf16 rounds to nearest even and turns NaN into a quiet NaN with the same top bits (GGML_FP32_TO_BF16;
// f32 subnormals are rounded, not flushed). Written with integer operations only, so the result does not depend on
// the FPU's rounding mode or flush-to-zero setting.
#include <bit>
#include <cstring>

#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"

namespace kestrel {

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits = 0;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);  // inf, or a NaN made quiet
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);  // normal: rebias the exponent
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal: mant * 2^-24. Shift the leading one up to bit 10 to make it the implicit bit of a normal f32.
    const int shift = std::countl_zero(mant) - 21;  // mant has its top bit at 31 - countl_zero
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (((mant << shift) & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 (half-way past the largest half): rounds to inf
  if (ax >= 0x38800000u) {                       // >= 2^-14: a normal half
    uint32_t h = ((((ax >> 23) - (127 - 15)) << 10) | ((ax >> 13) & 0x3FFu));
    const uint32_t rest = ax & 0x1FFFu;                        // the 13 mantissa bits dropped
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent, which is right
    return static_cast<uint16_t>(sign | h);
  }
  if (ax <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 itself is a tie, and 0 is even)
  // Half subnormal: round the full 24-bit significand to a count of 2^-24 units.
  const uint32_t significand = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - (ax >> 23);  // 14..24 for exponents 2^-15..2^-25
  uint32_t h = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;  // 0x400 is the smallest normal: also right
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN, made quiet
  const uint32_t round_bias = 0x7FFFu + ((x >> 16) & 1u);  // ties go to the even upper half
  return static_cast<uint16_t>((x + round_bias) >> 16);
}

namespace quant_internal {

void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h = 0;
    std::memcpy(&h, bytes + 2 * i, sizeof(h));
    dst[i] = fp16_to_f32(h);
  }
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h = 0;
    std::memcpy(&h, bytes + 2 * i, sizeof(h));
    dst[i] = bf16_to_f32(h);
  }
}

void quantize_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* bytes = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_fp16(src[i]);
    std::memcpy(bytes + 2 * i, &h, sizeof(h));
  }
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* bytes = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(src[i]);
    std::memcpy(bytes + 2 * i, &h, sizeof(h));
  }
}

}  // namespace quant_internal
}  // namespace kestrel
