// Vectorized whole-vocabulary scans; see logit_scan.h.
#include "core/sampler/logit_scan.h"

#include <cstring>
#include <limits>

namespace kestrel {
namespace {

using V4f = float __attribute__((vector_size(16)));
using V4i = int32_t __attribute__((vector_size(16)));

constexpr float kInf = std::numeric_limits<float>::infinity();

V4f load4(const float* p) {
  V4f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

float max_logit_of(std::span<const float> logits) {
  const float* p = logits.data();
  const size_t n = logits.size();
  V4f m0 = {-kInf, -kInf, -kInf, -kInf};
  V4f m1 = m0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V4f a = load4(p + i);
    const V4f b = load4(p + i + 4);
    m0 = a > m0 ? a : m0;  // a NaN compares false and is skipped
    m1 = b > m1 ? b : m1;
  }
  float best = -kInf;
  for (int j = 0; j < 4; ++j) {
    best = m0[j] > best ? m0[j] : best;
    best = m1[j] > best ? m1[j] : best;
  }
  for (; i < n; ++i) best = p[i] > best ? p[i] : best;
  return best;
}

int32_t argmax_lowest(std::span<const float> logits) {
  // One pass: per lane the best value and the first index holding it (strict >), then the lanes combined with ties
  // to the lower index, then the tail (higher indices, so strict > again).
  const float* p = logits.data();
  const size_t n = logits.size();
  V4f m0 = {-kInf, -kInf, -kInf, -kInf};
  V4f m1 = m0;
  V4i at0 = {0, 0, 0, 0};
  V4i at1 = at0;
  V4i cur0 = {0, 1, 2, 3};
  V4i cur1 = {4, 5, 6, 7};
  const V4i step = {8, 8, 8, 8};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V4f a = load4(p + i);
    const V4f b = load4(p + i + 4);
    const V4i gt0 = a > m0;
    const V4i gt1 = b > m1;
    m0 = gt0 ? a : m0;
    m1 = gt1 ? b : m1;
    at0 = gt0 ? cur0 : at0;
    at1 = gt1 ? cur1 : at1;
    cur0 += step;
    cur1 += step;
  }
  float best = -kInf;
  int32_t best_at = 0;
  auto consider = [&](float v, int32_t at) {
    if (v > best || (v == best && v > -kInf && at < best_at)) {
      best = v;
      best_at = at;
    }
  };
  for (int j = 0; j < 4; ++j) {
    consider(m0[j], at0[j]);
    consider(m1[j], at1[j]);
  }
  for (; i < n; ++i) {
    if (p[i] > best) {
      best = p[i];
      best_at = static_cast<int32_t>(i);
    }
  }
  return best_at;  // 0 when no logit is > -inf
}

LogitScan scan_logits(std::span<const float> logits) {
  const float* p = logits.data();
  const size_t n = logits.size();
  const V4f pos_inf = {kInf, kInf, kInf, kInf};
  const V4f neg_inf = -pos_inf;
  V4i bad = {0, 0, 0, 0};
  V4i unmasked = bad;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const V4f a = load4(p + i);
    bad |= !(a < pos_inf);  // NaN or +inf
    unmasked |= (a > neg_inf) & (a < pos_inf);
  }
  LogitScan out;
  for (int j = 0; j < 4; ++j) {
    out.any_nan_or_pos_inf |= bad[j] != 0;
    out.any_unmasked |= unmasked[j] != 0;
  }
  for (; i < n; ++i) {
    out.any_nan_or_pos_inf |= !(p[i] < kInf);
    out.any_unmasked |= p[i] > -kInf && p[i] < kInf;
  }
  return out;
}

}  // namespace kestrel
