// AVX-512 activation quantization (act_q8.h): the scalar level's operations on 16 lanes at a time, so the bytes are
// the same — the block maximum is a maximum (any order), d = max / 127 and its inverse are the same scalar divisions,
// each element's (x · id + 1.5·2^23) − 1.5·2^23 is the same two roundings (-ffp-contract=off: no fused multiply-add),
// the clamp lets a NaN through as std::clamp does, and the sums are exact integers. Compiled with the AVX-512 GEMV
// file's flags (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx512).
#include <immintrin.h>

#include <cstdint>

#include "cpu/act_q8.h"

namespace kestrel::cpu {
namespace {

constexpr float kRound = 12582912.0f;  // 1.5 · 2^23, as the scalar level

// max(acc, |v|) per lane; a NaN lane of v leaves acc (the scalar std::max(acc, |v|) skips NaN the same way).
inline __m512 max_abs(__m512 acc, __m512 v) { return _mm512_max_ps(_mm512_abs_ps(v), acc); }

// The scalar level's d = amax / 127 and id = 1 / d (0 for an all-zero block).
inline void scales(float amax, float* d, float* id) {
  *d = amax / 127.0f;
  *id = *d > 0.0f ? 1.0f / *d : 0.0f;
}

// round(v · id) clamped to [−127, 127] as int32 lanes: max(lo, r) and min(hi, r) return r where r is NaN, as
// std::clamp does, and its conversion gives what the scalar cast gives (0x80000000, whose low byte is 0).
inline __m512i quant16(__m512 v, __m512 id) {
  const __m512 round = _mm512_set1_ps(kRound);
  const __m512 r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, id), round), round);
  const __m512 c = _mm512_min_ps(_mm512_set1_ps(127.0f), _mm512_max_ps(_mm512_set1_ps(-127.0f), r));
  return _mm512_cvttps_epi32(c);
}

// Block b (kQ8, 32 elements) of vector xv: its quants, lane scales, negated lane sums, block sum, Q4_0 lane terms.
inline void block32(const float* xv, int8_t* q, float* dl, int32_t* ns4, float* ds, float* db, int32_t* nq, int64_t b) {
  const __m512 a0 = _mm512_loadu_ps(xv + 32 * b);
  const __m512 a1 = _mm512_loadu_ps(xv + 32 * b + 16);
  const float amax = _mm512_reduce_max_ps(max_abs(max_abs(_mm512_setzero_ps(), a0), a1));
  float d = 0.0f, id = 0.0f;
  scales(amax, &d, &id);
  const __m512 idv = _mm512_set1_ps(id);
  const __m128i q0 = _mm512_cvtepi32_epi8(quant16(a0, idv));
  const __m128i q1 = _mm512_cvtepi32_epi8(quant16(a1, idv));
  const __m256i qb = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), qb);
  // Sums of 4 consecutive quants: unsigned ones times the signed quants, 4 products per 32-bit lane.
  const __m256i s4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), qb);
  const __m256i ns = _mm256_sub_epi32(_mm256_setzero_si256(), s4);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(ns4 + 8 * b), ns);
  const __m128i halves = _mm_add_epi32(_mm256_castsi256_si128(ns), _mm256_extracti128_si256(ns, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(nq + 4 * b), _mm_slli_epi32(halves, 3));
  _mm256_storeu_ps(dl + 8 * b, _mm256_set1_ps(d));
  ds[b] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_zextsi256_si512(s4)));
  db[b] = d;
}

}  // namespace

void act_q8_quantize_avx512(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out) {
  const int64_t nb = n_in / kActQ8Block;
  for (int64_t v = v_begin; v < v_end; ++v) {
    for (int64_t b = 0; b < nb; ++b) {
      block32(x + v * n_in, out.q() + v * n_in, out.dl() + v * (n_in / 4), out.ns4() + v * (n_in / 4),
              out.ds() + v * nb, out.d() + v * nb, out.nq() + v * (n_in / 8), b);
    }
  }
}

void act_q8k_quantize_avx512(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out) {
  const int64_t nb = n_in / kActQ8KBlock;
  constexpr int kVecs = kActQ8KBlock / 16;
  static_assert(kActQ8KSum == 16, "one 16-lane vector per 16-element sum");
  for (int64_t v = v_begin; v < v_end; ++v) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + v * n_in + b * kActQ8KBlock;
      __m512 m = _mm512_setzero_ps();
      for (int i = 0; i < kVecs; ++i) m = max_abs(m, _mm512_loadu_ps(xb + 16 * i));
      float d = 0.0f, id = 0.0f;
      scales(_mm512_reduce_max_ps(m), &d, &id);
      out.dk()[v * nb + b] = d;
      const __m512 idv = _mm512_set1_ps(id);
      int8_t* q = out.qk() + v * n_in + b * kActQ8KBlock;
      int16_t* bsum = out.bsum() + (v * n_in + b * kActQ8KBlock) / kActQ8KSum;
      for (int i = 0; i < kVecs; ++i) {
        const __m128i qi = _mm512_cvtepi32_epi8(quant16(_mm512_loadu_ps(xb + 16 * i), idv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), qi);
        bsum[i] = static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(qi)));  // the stored quants' sum
      }
    }
  }
}

}  // namespace kestrel::cpu
