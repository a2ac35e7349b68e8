// Q4_K: super-blocks of 256 elements in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min (packed as
// k4_get_scale_min describes) under the f16 super-block scales d and dmin: value = (d * sc) * q - (dmin * m),
// q in [0, 15]. qs holds 4 chunks of 64 elements: byte l of chunk c has element 64c + l in its low nibble
// (sub-block 2c) and element 64c + 32 + l in its high nibble (sub-block 2c + 1). ggml's dequantize_row_q4_K.
#include <cstddef>
#include <cstring>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"

namespace kestrel::quant_internal {

void dequantize_q4_k(const void* src, float* dst, int64_t nb) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_K blk;
    std::memcpy(&blk, bytes + b * sizeof(BlockQ4_K), sizeof(blk));
    const float d = fp16_to_f32(blk.d);
    const float dmin = fp16_to_f32(blk.dmin);
    float* y = dst + b * kQK_K;
    for (ptrdiff_t c = 0; c < 4; ++c) {
      uint8_t sc_lo = 0, m_lo = 0, sc_hi = 0, m_hi = 0;
      k4_get_scale_min(static_cast<int>(2 * c), blk.scales, &sc_lo, &m_lo);
      k4_get_scale_min(static_cast<int>(2 * c + 1), blk.scales, &sc_hi, &m_hi);
      const float step_lo = d * static_cast<float>(sc_lo);
      const float offset_lo = dmin * static_cast<float>(m_lo);
      const float step_hi = d * static_cast<float>(sc_hi);
      const float offset_hi = dmin * static_cast<float>(m_hi);
      const uint8_t* q = &blk.qs[32 * c];
      for (int l = 0; l < 32; ++l) y[64 * c + l] = step_lo * static_cast<float>(q[l] & 0x0F) - offset_lo;
      for (int l = 0; l < 32; ++l) y[64 * c + 32 + l] = step_hi * static_cast<float>(q[l] >> 4) - offset_hi;
    }
  }
}

Status quantize_q4_k(const float* src, void* dst, int64_t nb) {
  KESTREL_TRY(check_finite(src, nb * kQK_K, "q4_K"));
  auto* bytes = static_cast<unsigned char*>(dst);
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_K blk;
    uint8_t levels[kQK_K];
    KESTREL_TRY(quantize_k4_superblock(src + b * kQK_K, 15, b, "q4_K", &blk.d, &blk.dmin, blk.scales, levels));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        blk.qs[32 * c + l] = static_cast<uint8_t>(levels[64 * c + l] | (levels[64 * c + 32 + l] << 4));
      }
    }
    std::memcpy(bytes + b * sizeof(BlockQ4_K), &blk, sizeof(blk));
  }
  return ok_status();
}

}  // namespace kestrel::quant_internal
