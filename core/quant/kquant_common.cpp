// Helpers the block quantizers share: input/scale checks, rounding, the 6-bit scale packing of Q4_K/Q5_K, and the
// sub-block fits of the K-quant quantizers.
//
// The fits follow the approach of ggml's reference K-quant quantizers (a small grid of candidate step sizes around
// range / nmax, each refitted by weighted least squares, keeping the one with the least weighted squared error;
// then the sub-block scales are themselves quantized to 6 bits against an f16 super-block scale and every element
// is requantized with the scales actually stored). They are not bit-identical to ggml; what must hold is that
// dequantize_row reproduces the input within the format's precision (tests/core/quant bound the error).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"

namespace kestrel::quant_internal {
namespace {

constexpr int kSubBlocks = kQK_K / 32;  // Q4_K/Q5_K: 8 sub-blocks of 32

}  // namespace

Status check_finite(const float* x, int64_t n, std::string_view type_name) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return make_error(ErrorCode::kInvalidArgument, "cannot quantize " + std::string(x[i] != x[i] ? "NaN" : "inf") +
                                                         " at element " + std::to_string(i) + " to " +
                                                         std::string(type_name) + " (only f32/f16/bf16 hold NaN/inf)");
    }
  }
  return ok_status();
}

Status check_scale_finite(uint16_t scale_f16, int64_t block, std::string_view type_name) {
  if ((scale_f16 & 0x7C00u) == 0x7C00u) {
    return make_error(ErrorCode::kOutOfRange, "values in block " + std::to_string(block) + " are too large for " +
                                                  std::string(type_name) + ": its f16 scale overflows (max 65504)");
  }
  return ok_status();
}

int round_clamped(float v, int lo, int hi) {
  // Clamp in float first (a tiny step makes huge ratios); NaN, from an overflowed range, goes to lo.
  const float c =
      v > static_cast<float>(hi) ? static_cast<float>(hi) : (v >= static_cast<float>(lo) ? v : static_cast<float>(lo));
  return static_cast<int>(std::nearbyint(c));
}

void k4_get_scale_min(int j, const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = packed[j] & 0x3F;
    *min = packed[j + 4] & 0x3F;
  } else {
    *scale = static_cast<uint8_t>((packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

void k4_put_scale_min(int j, uint8_t scale, uint8_t min, uint8_t* packed) {
  if (j < 4) {
    packed[j] = static_cast<uint8_t>(packed[j] | scale);
    packed[j + 4] = static_cast<uint8_t>(packed[j + 4] | min);
  } else {
    packed[j + 4] = static_cast<uint8_t>((scale & 0x0F) | ((min & 0x0F) << 4));
    packed[j - 4] = static_cast<uint8_t>(packed[j - 4] | ((scale >> 4) << 6));
    packed[j] = static_cast<uint8_t>(packed[j] | ((min >> 4) << 6));
  }
}

float fit_scale_min(const float* x, const float* w, int n, int nmax, uint8_t* levels, float* min_out) {
  float lo = x[0];
  float hi = x[0];
  double sum_w = 0.0;
  double sum_wx = 0.0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_wx += static_cast<double>(w[i]) * x[i];
  }
  lo = std::min(lo, 0.0f);  // the stored min only ever subtracts, so the range always includes 0
  if (hi <= lo) {           // all equal and <= 0 (all zero included): the min alone carries it
    std::fill(levels, levels + n, uint8_t{0});
    *min_out = -lo;
    return 0.0f;
  }

  auto weighted_error = [&](float scale, float offset, const uint8_t* q) {
    double err = 0.0;
    for (int i = 0; i < n; ++i) {
      const double diff = static_cast<double>(scale) * q[i] + offset - x[i];
      err += w[i] * diff * diff;
    }
    return err;
  };

  // Candidate 0: the plain step (hi - lo) / nmax anchored at lo.
  const float range = hi - lo;
  float best_scale = range / static_cast<float>(nmax);
  float best_offset = lo;
  for (int i = 0; i < n; ++i) levels[i] = static_cast<uint8_t>(round_clamped((x[i] - lo) / best_scale, 0, nmax));
  double best_err = weighted_error(best_scale, best_offset, levels);

  // Candidates 1..: steps range / (nmax + t), t in [-1, 1]; for each rounding, the least-squares (scale, offset).
  uint8_t cand[kQK_K];
  for (int step = 0; step <= 20; ++step) {
    const float inv_step = (static_cast<float>(nmax) - 1.0f + 0.1f * static_cast<float>(step)) / range;
    double sum_wl = 0.0;
    double sum_wl2 = 0.0;
    double sum_wxl = 0.0;
    for (int i = 0; i < n; ++i) {
      const int l = round_clamped(inv_step * (x[i] - lo), 0, nmax);
      cand[i] = static_cast<uint8_t>(l);
      sum_wl += static_cast<double>(w[i]) * l;
      sum_wl2 += static_cast<double>(w[i]) * l * l;
      sum_wxl += static_cast<double>(w[i]) * l * x[i];
    }
    const double det = sum_w * sum_wl2 - sum_wl * sum_wl;
    if (!(det > 0.0)) continue;  // every l equal: no line to fit
    double scale = (sum_w * sum_wxl - sum_wx * sum_wl) / det;
    double offset = (sum_wl2 * sum_wx - sum_wl * sum_wxl) / det;
    if (offset > 0.0) {  // a positive offset cannot be stored: refit the scale alone
      offset = 0.0;
      scale = sum_wxl / sum_wl2;
    }
    if (!(scale > 0.0)) continue;
    const double err = weighted_error(static_cast<float>(scale), static_cast<float>(offset), cand);
    if (err < best_err) {
      best_err = err;
      best_scale = static_cast<float>(scale);
      best_offset = static_cast<float>(offset);
      std::copy(cand, cand + n, levels);
    }
  }
  *min_out = -best_offset;
  return best_scale;
}

float fit_scale_symmetric(const float* x, int n, int nmax) {
  float amax = 0.0f;
  float max = 0.0f;  // signed value of largest magnitude
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0.0f) return 0.0f;
  // Steps max / -(nmax + t), t in [-0.9, 0.9]: the extreme lands on -nmax (the side with the extra level). The
  // weights x^2 favour the large elements; doubles keep x^3 of tiny or huge floats in range.
  double best_score = -1.0;
  double best_scale = static_cast<double>(max) / -nmax;
  for (int t = -9; t <= 9; ++t) {
    const double inv_step = -(nmax + 0.1 * t) / static_cast<double>(max);
    double sum_wxl = 0.0;
    double sum_wl2 = 0.0;
    for (int i = 0; i < n; ++i) {
      const double xi = x[i];
      const double l = std::clamp(std::nearbyint(inv_step * xi), static_cast<double>(-nmax), nmax - 1.0);
      sum_wxl += xi * xi * xi * l;
      sum_wl2 += xi * xi * l * l;
    }
    if (!(sum_wl2 > 0.0)) continue;
    const double score = sum_wxl * sum_wxl / sum_wl2;  // the weighted error is sum w x^2 - score
    if (score > best_score) {
      best_score = score;
      best_scale = sum_wxl / sum_wl2;
    }
  }
  return static_cast<float>(best_scale);
}

Status quantize_k4_superblock(const float* x, int nmax, int64_t block, std::string_view type_name, uint16_t* d,
                              uint16_t* dmin, uint8_t* packed_scales, uint8_t* levels) {
  float scales[kSubBlocks];
  float mins[kSubBlocks];
  float weights[32];
  float max_scale = 0.0f;
  float max_min = 0.0f;
  for (ptrdiff_t j = 0; j < kSubBlocks; ++j) {
    const float* xs = &x[32 * j];
    double sum_x2 = 0.0;
    for (int l = 0; l < 32; ++l) sum_x2 += static_cast<double>(xs[l]) * xs[l];
    const auto rms = static_cast<float>(std::sqrt(sum_x2 / 32.0));
    for (int l = 0; l < 32; ++l) weights[l] = rms + std::fabs(xs[l]);
    scales[j] = fit_scale_min(xs, weights, 32, nmax, &levels[32 * j], &mins[j]);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }

  *d = f32_to_fp16(max_scale / 63.0f);
  *dmin = f32_to_fp16(max_min / 63.0f);
  KESTREL_TRY(check_scale_finite(*d, block, type_name));
  KESTREL_TRY(check_scale_finite(*dmin, block, type_name));
  const float d_f = fp16_to_f32(*d);
  const float dmin_f = fp16_to_f32(*dmin);

  std::memset(packed_scales, 0, kKScaleSize);
  for (int j = 0; j < kSubBlocks; ++j) {
    const int ls = d_f > 0.0f ? round_clamped(scales[j] / d_f, 0, 63) : 0;
    const int lm = dmin_f > 0.0f ? round_clamped(mins[j] / dmin_f, 0, 63) : 0;
    k4_put_scale_min(j, static_cast<uint8_t>(ls), static_cast<uint8_t>(lm), packed_scales);
  }

  // Requantize against the scales as dequantize_row will see them: y = (d * sc) * q - (dmin * m).
  for (int j = 0; j < kSubBlocks; ++j) {
    uint8_t sc = 0;
    uint8_t m = 0;
    k4_get_scale_min(j, packed_scales, &sc, &m);
    const float step = d_f * static_cast<float>(sc);
    const float offset = dmin_f * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      const int q = step > 0.0f ? round_clamped((x[32 * j + l] + offset) / step, 0, nmax) : 0;
      levels[32 * j + l] = static_cast<uint8_t>(q);
    }
  }
  return ok_status();
}

}  // namespace kestrel::quant_internal
