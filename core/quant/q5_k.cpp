// Q5_K: as Q4_K (super-blocks of 256, 8 sub-blocks of 32 with packed 6-bit scales/mins under f16 d and dmin) with
// a fifth quant bit: value = (d * sc) * q - (dmin * m), q in [0, 31]. qs holds the low 4 bits exactly as Q4_K's
// nibbles; the high bit of element 64c + l is bit 2c of qh[l], that of element 64c + 32 + l bit 2c + 1 of qh[l].
// ggml's dequantize_row_q5_K.
#include <cstddef>
#include <cstring>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"

namespace kestrel::quant_internal {

void dequantize_q5_k(const void* src, float* dst, int64_t nb) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ5_K blk;
    std::memcpy(&blk, bytes + b * sizeof(BlockQ5_K), sizeof(blk));
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
      const auto bit_lo = static_cast<int>(2 * c);
      const auto bit_hi = static_cast<int>(2 * c + 1);
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] & 0x0F) | (((blk.qh[l] >> bit_lo) & 1) << 4);
        y[64 * c + l] = step_lo * static_cast<float>(v) - offset_lo;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] >> 4) | (((blk.qh[l] >> bit_hi) & 1) << 4);
        y[64 * c + 32 + l] = step_hi * static_cast<float>(v) - offset_hi;
      }
    }
  }
}

Status quantize_q5_k(const float* src, void* dst, int64_t nb) {
  KESTREL_TRY(check_finite(src, nb * kQK_K, "q5_K"));
  auto* bytes = static_cast<unsigned char*>(dst);
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ5_K blk;
    uint8_t levels[kQK_K];
    KESTREL_TRY(quantize_k4_superblock(src + b * kQK_K, 31, b, "q5_K", &blk.d, &blk.dmin, blk.scales, levels));
    std::memset(blk.qh, 0, sizeof(blk.qh));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = levels[64 * c + l];
        const int hi = levels[64 * c + 32 + l];
        blk.qs[32 * c + l] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
        blk.qh[l] = static_cast<uint8_t>(blk.qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
    std::memcpy(bytes + b * sizeof(BlockQ5_K), &blk, sizeof(blk));
  }
  return ok_status();
}

}  // namespace kestrel::quant_internal
