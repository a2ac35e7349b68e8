// Q4_0: blocks of 32 four-bit quants with one f16 scale; value = (q - 8) * d. Byte j of qs holds element j in its
// low nibble and element j + 16 in its high nibble.
//
// The quantizer is ggml's reference (quantize_row_q4_0_ref): the element of largest magnitude (the first one on
// ties) maps to q = 0, i.e. d = x_max / -8, and q = min(15, trunc(x / d + 8.5)) using the f32 d.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"

namespace kestrel::quant_internal {

void dequantize_q4_0(const void* src, float* dst, int64_t nb) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_0 blk;
    std::memcpy(&blk, bytes + b * sizeof(BlockQ4_0), sizeof(blk));
    const float d = fp16_to_f32(blk.d);
    float* y = dst + b * kQK4_0;
    for (int j = 0; j < kHalf; ++j) {
      const int lo = (blk.qs[j] & 0x0F) - 8;
      const int hi = (blk.qs[j] >> 4) - 8;
      y[j] = static_cast<float>(lo) * d;
      y[j + kHalf] = static_cast<float>(hi) * d;
    }
  }
}

Status quantize_q4_0(const float* src, void* dst, int64_t nb) {
  KESTREL_TRY(check_finite(src, nb * kQK4_0, "q4_0"));
  auto* bytes = static_cast<unsigned char*>(dst);
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQK4_0;
    float amax = 0.0f;
    float max = 0.0f;  // the signed value of largest magnitude
    for (int j = 0; j < kQK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 blk;
    blk.d = f32_to_fp16(d);
    KESTREL_TRY(check_scale_finite(blk.d, b, "q4_0"));
    for (int j = 0; j < kHalf; ++j) {
      // x * inv_d lies in [-8, 8], so the sums are in [0.5, 16.5] and truncation is a floor.
      const int lo = std::min(15, static_cast<int>(x[j] * inv_d + 8.5f));
      const int hi = std::min(15, static_cast<int>(x[j + kHalf] * inv_d + 8.5f));
      blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    std::memcpy(bytes + b * sizeof(BlockQ4_0), &blk, sizeof(blk));
  }
  return ok_status();
}

}  // namespace kestrel::quant_internal
