// Q6_K: super-blocks of 256 elements in 16 groups of 16, each with a signed 8-bit scale under one f16 d:
// value = (d * sc) * (q - 32), q in [0, 63]. The block is two halves of 128; in half h, for l in [0, 32):
//   element 128h +      l: low nibble of ql[64h + l],      bits 0-1 of qh[32h + l], scale 8h + l/16
//   element 128h + 32 + l: low nibble of ql[64h + 32 + l], bits 2-3 of qh[32h + l], scale 8h + l/16 + 2
//   element 128h + 64 + l: high nibble of ql[64h + l],     bits 4-5 of qh[32h + l], scale 8h + l/16 + 4
//   element 128h + 96 + l: high nibble of ql[64h + 32 + l], bits 6-7 of qh[32h + l], scale 8h + l/16 + 6
// ggml's dequantize_row_q6_K.
#include <cmath>
#include <cstddef>
#include <cstring>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"

namespace kestrel::quant_internal {

namespace {

void block_quants(const BlockQ6_K& blk, uint8_t* q) {
  for (ptrdiff_t h = 0; h < 2; ++h) {
    const uint8_t* ql = &blk.ql[64 * h];
    const uint8_t* qh = &blk.qh[32 * h];
    uint8_t* y = &q[128 * h];
    for (int l = 0; l < 32; ++l) {
      y[l] = static_cast<uint8_t>((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4));
      y[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
      y[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      y[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

}  // namespace

void dequantize_q6_k(const void* src, float* dst, int64_t nb) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  uint8_t q[kQK_K];
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ6_K blk;
    std::memcpy(&blk, bytes + b * sizeof(BlockQ6_K), sizeof(blk));
    block_quants(blk, q);
    const float d = fp16_to_f32(blk.d);
    for (int e = 0; e < kQK_K; ++e) {  // element e's scale: its 16-element sub-block's
      dst[b * kQK_K + e] = d * static_cast<float>(blk.scales[e / 16]) * static_cast<float>(q[e] - 32);
    }
  }
}

Status quantize_q6_k(const float* src, void* dst, int64_t nb) {
  KESTREL_TRY(check_finite(src, nb * kQK_K, "q6_K"));
  constexpr int kGroups = kQK_K / 16;
  auto* bytes = static_cast<unsigned char*>(dst);
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQK_K;
    float scales[kGroups];
    float max_scale = 0.0f;  // signed scale of largest magnitude
    for (ptrdiff_t g = 0; g < kGroups; ++g) {
      scales[g] = fit_scale_symmetric(&x[16 * g], 16, 32);
      if (std::fabs(scales[g]) > std::fabs(max_scale)) max_scale = scales[g];
    }

    BlockQ6_K blk;
    std::memset(&blk, 0, sizeof(blk));
    // The group scale of largest magnitude maps to sc = -128 (so d takes the opposite sign); every other sc then
    // fits [-128, 127].
    blk.d = f32_to_fp16(max_scale != 0.0f ? max_scale / -128.0f : 0.0f);  // +0 for an all-zero block
    KESTREL_TRY(check_scale_finite(blk.d, b, "q6_K"));
    const float d = fp16_to_f32(blk.d);
    for (int g = 0; g < kGroups; ++g) {
      blk.scales[g] = static_cast<int8_t>(d != 0.0f ? round_clamped(scales[g] / d, -128, 127) : 0);
    }

    uint8_t levels[kQK_K];  // q in [0, 63]; 32 is zero
    for (int g = 0; g < kGroups; ++g) {
      const float step = d * static_cast<float>(blk.scales[g]);
      for (int i = 0; i < 16; ++i) {
        const int q = step != 0.0f ? round_clamped(x[16 * g + i] / step, -32, 31) : 0;
        levels[16 * g + i] = static_cast<uint8_t>(q + 32);
      }
    }

    for (ptrdiff_t h = 0; h < 2; ++h) {
      const uint8_t* levels_h = &levels[128 * h];
      for (int l = 0; l < 32; ++l) {
        blk.ql[64 * h + l] = static_cast<uint8_t>((levels_h[l] & 0x0F) | ((levels_h[l + 64] & 0x0F) << 4));
        blk.ql[64 * h + 32 + l] = static_cast<uint8_t>((levels_h[l + 32] & 0x0F) | ((levels_h[l + 96] & 0x0F) << 4));
        blk.qh[32 * h + l] = static_cast<uint8_t>((levels_h[l] >> 4) | ((levels_h[l + 32] >> 4) << 2) |
                                                  ((levels_h[l + 64] >> 4) << 4) | ((levels_h[l + 96] >> 4) << 6));
      }
    }
    std::memcpy(bytes + b * sizeof(BlockQ6_K), &blk, sizeof(blk));
  }
  return ok_status();
}

}  // namespace kestrel::quant_internal
