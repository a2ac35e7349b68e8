// Q8_0: blocks of 32 int8 quants with one f16 scale; value = q * d.
//
// The quantizer is ggml's reference (quantize_row_q8_0_ref): d = max|x| / 127, q = round-half-away(x / d) using
// the f32 d (not its f16 rounding), so files Kestrel writes match llama.cpp's byte for byte.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"

namespace kestrel::quant_internal {

void dequantize_q8_0(const void* src, float* dst, int64_t nb) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ8_0 blk;
    std::memcpy(&blk, bytes + b * sizeof(BlockQ8_0), sizeof(blk));
    const float d = fp16_to_f32(blk.d);
    float* y = dst + b * kQK8_0;
    for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(blk.qs[j]) * d;
  }
}

Status quantize_q8_0(const float* src, void* dst, int64_t nb) {
  KESTREL_TRY(check_finite(src, nb * kQK8_0, "q8_0"));
  auto* bytes = static_cast<unsigned char*>(dst);
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 blk;
    blk.d = f32_to_fp16(d);
    KESTREL_TRY(check_scale_finite(blk.d, b, "q8_0"));
    for (int j = 0; j < kQK8_0; ++j) blk.qs[j] = static_cast<int8_t>(std::round(x[j] * inv_d));
    std::memcpy(bytes + b * sizeof(BlockQ8_0), &blk, sizeof(blk));
  }
  return ok_status();
}

}  // namespace kestrel::quant_internal
