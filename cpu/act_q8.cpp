// Int8 quantization of activations per 32- and per 256-element block (act_q8.h): the scalar level, and the dispatch
// to act_q8_avx512.cpp. Compiled with -ffp-contract=off like the scalar kernels, so the bytes do not depend on the
// compiler fusing a multiply-add.
#include "cpu/act_q8.h"

#include <algorithm>
#include <cmath>

namespace kestrel::cpu {
namespace {

// q[0..n) = nearbyint(x / d) with d = max|x| / 127 (0 for an all-zero block); returns d.
float quantize_block(const float* x, int64_t n, int8_t* q) {
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    // Round to nearest, ties to even, as nearbyint in the default mode: adding and taking away 1.5·2^23 leaves the
    // integer part in the significand (|x·id| <= 127.0001 < 2^22); plain arithmetic, no libm call.
    const float r = (x[i] * id + kRound) - kRound;
    q[i] = static_cast<int8_t>(static_cast<int32_t>(std::clamp(r, -127.0f, 127.0f)));
  }
  return d;
}

}  // namespace

ActQ8View ActQ8Buffer::reserve(int64_t n_vec, int64_t n_in, ActQ8Forms forms) {
  const size_t n = static_cast<size_t>(n_vec * n_in);
  ActQ8View view;
  if (forms.block32) {
    if (q_.size() < n) q_.resize(n);
    if (dl_.size() < n / 4) dl_.resize(n / 4);
    if (ns4_.size() < n / 4) ns4_.resize(n / 4);
    if (ds_.size() < n / 32) ds_.resize(n / 32);
    if (d_.size() < n / 32) d_.resize(n / 32);
    if (nq_.size() < n / 8) nq_.resize(n / 8);
    view.q = q_.data();
    view.dl = dl_.data();
    view.ns4 = ns4_.data();
    view.ds = ds_.data();
    view.d = d_.data();
    view.nq = nq_.data();
  }
  if (forms.block256) {
    if (qk_.size() < n) qk_.resize(n);
    if (dk_.size() < n / 256) dk_.resize(n / 256);
    if (bsum_.size() < n / 16) bsum_.resize(n / 16);
    view.qk = qk_.data();
    view.dk = dk_.data();
    view.bsum = bsum_.data();
  }
  return view;
}

namespace {

void quantize_scalar(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out) {
  const int64_t nb = n_in / kActQ8Block;
  for (int64_t v = v_begin; v < v_end; ++v) {
    const float* xv = x + v * n_in;
    int8_t* q = out.q() + v * n_in;
    float* dl = out.dl() + v * (n_in / 4);
    int32_t* ns4 = out.ns4() + v * (n_in / 4);
    float* ds = out.ds() + v * nb;
    float* db = out.d() + v * nb;
    int32_t* nq = out.nq() + v * (n_in / 8);
    for (int64_t b = 0; b < nb; ++b) {
      int8_t* qb = q + b * kActQ8Block;
      const float d = quantize_block(xv + b * kActQ8Block, kActQ8Block, qb);
      int32_t sum = 0;
      for (int64_t l = 0; l < kActQ8Block / 4; ++l) {
        const int8_t* ql = qb + 4 * l;
        const int32_t s4 = static_cast<int32_t>(ql[0]) + ql[1] + ql[2] + ql[3];
        dl[b * 8 + l] = d;
        ns4[b * 8 + l] = -s4;
        sum += s4;
      }
      ds[b] = d * static_cast<float>(sum);
      db[b] = d;
      for (int64_t l = 0; l < 4; ++l) nq[b * 4 + l] = 8 * (ns4[b * 8 + l] + ns4[b * 8 + 4 + l]);
    }
  }
}

void quantize_k_scalar(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out) {
  const int64_t nb = n_in / kActQ8KBlock;
  for (int64_t v = v_begin; v < v_end; ++v) {
    const float* xv = x + v * n_in;
    int8_t* q = out.qk() + v * n_in;
    int16_t* bsum = out.bsum() + v * (n_in / kActQ8KSum);
    for (int64_t b = 0; b < nb; ++b)
      out.dk()[v * nb + b] = quantize_block(xv + b * kActQ8KBlock, kActQ8KBlock, q + b * kActQ8KBlock);
    for (int64_t g = 0; g < n_in / kActQ8KSum; ++g) {
      int32_t s = 0;
      for (int64_t i = 0; i < kActQ8KSum; ++i) s += q[g * kActQ8KSum + i];
      bsum[g] = static_cast<int16_t>(s);
    }
  }
}

}  // namespace

void act_q8_quantize_avx512(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out);
void act_q8k_quantize_avx512(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out);

void act_q8_quantize(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out, Isa isa) {
  if (isa == Isa::kAvx512 && isa_supported(Isa::kAvx512)) {
    act_q8_quantize_avx512(x, n_in, v_begin, v_end, out);
  } else {
    quantize_scalar(x, n_in, v_begin, v_end, out);
  }
}

void act_q8k_quantize(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out, Isa isa) {
  if (isa == Isa::kAvx512 && isa_supported(Isa::kAvx512)) {
    act_q8k_quantize_avx512(x, n_in, v_begin, v_end, out);
  } else {
    quantize_k_scalar(x, n_in, v_begin, v_end, out);
  }
}

}  // namespace kestrel::cpu
