// Block layouts of the GGUF quant formats, byte-for-byte as ggml-common.h defines them (pinned by static_asserts).
// d/dmin are IEEE halves stored as uint16_t. QK_K = 256 super-block elements; K_SCALE_SIZE = 12.
#pragma once

#include <cstdint>

namespace kestrel {

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK_K = 256;
inline constexpr int kKScaleSize = 12;

struct BlockQ4_0 {
  uint16_t d;  // scale
  // nibbles: element j in the low nibble of qs[j], element j+16 in its high nibble; value = (q - 8) * d
  uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

struct BlockQ8_0 {
  uint16_t d;         // scale
  int8_t qs[kQK8_0];  // value = q * d
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_K {
  uint16_t d;                   // super-block scale for the 6-bit scales
  uint16_t dmin;                // super-block scale for the 6-bit mins
  uint8_t scales[kKScaleSize];  // 8 scales and 8 mins, 6 bits each, packed
  uint8_t qs[kQK_K / 2];        // 4-bit quants
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];  // high bit of each quant
  uint8_t qs[kQK_K / 2];  // low 4 bits
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit scales of 16-element groups
  uint16_t d;                 // super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

}  // namespace kestrel
