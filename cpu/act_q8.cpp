// Per-block int8 quantization of activations (act_q8.h). Compiled with -ffp-contract=off like the scalar kernels,
// so the bytes do not depend on the compiler fusing a multiply-add.
#include "cpu/act_q8.h"

#include <algorithm>
#include <cmath>

namespace kestrel::cpu {

ActQ8View ActQ8Buffer::reserve(int64_t n_vec, int64_t n_in) {
  const size_t n = static_cast<size_t>(n_vec * n_in);
  if (q_.size() < n) q_.resize(n);
  if (dl_.size() < n / 4) dl_.resize(n / 4);
  if (ns4_.size() < n / 4) ns4_.resize(n / 4);
  if (ds_.size() < n / 32) ds_.resize(n / 32);
  return ActQ8View{q_.data(), dl_.data(), ns4_.data(), ds_.data()};
}

void act_q8_quantize(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out) {
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  const int64_t nb = n_in / kActQ8Block;
  for (int64_t v = v_begin; v < v_end; ++v) {
    const float* xv = x + v * n_in;
    int8_t* q = out.q() + v * n_in;
    float* dl = out.dl() + v * (n_in / 4);
    int32_t* ns4 = out.ns4() + v * (n_in / 4);
    float* ds = out.ds() + v * nb;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xv + b * kActQ8Block;
      float amax = 0.0f;
      for (int64_t i = 0; i < kActQ8Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float d = amax / 127.0f;
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      int32_t sum = 0;
      for (int64_t i = 0; i < kActQ8Block; ++i) {
        // Round to nearest, ties to even, as nearbyint in the default mode: adding and taking away 1.5·2^23 leaves
        // the integer part in the significand (|x·id| <= 127.0001 < 2^22); plain arithmetic, no libm call.
        const float r = (xb[i] * id + kRound) - kRound;
        const int32_t qi = static_cast<int32_t>(std::clamp(r, -127.0f, 127.0f));
        q[b * kActQ8Block + i] = static_cast<int8_t>(qi);
        sum += qi;
      }
      for (int64_t l = 0; l < kActQ8Block / 4; ++l) {
        const int8_t* ql = q + b * kActQ8Block + 4 * l;
        dl[b * 8 + l] = d;
        ns4[b * 8 + l] = -(static_cast<int32_t>(ql[0]) + ql[1] + ql[2] + ql[3]);
      }
      ds[b] = d * static_cast<float>(sum);
    }
  }
}

}  // namespace kestrel::cpu
