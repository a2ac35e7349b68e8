// f32 vector operations for the SIMD kernel templates (gemv_simd.h, delta_rule_simd.h, attend_simd.h), one struct per
// level: Vec, kLanes, zero(), set1(float), loadu(const float*), storeu(float*, Vec), add, sub, mul, fma(a, b, c) = a·b
// + c, fnma(a, b, c) = c − a·b, and hsum(Vec), a horizontal sum in a fixed order. Each struct is compiled only where
// its instructions are enabled: a file compiled with the AVX2 (AVX-512) flags of cpu/CMakeLists.txt defines
// KESTREL_SIMD_AVX2 (KESTREL_SIMD_AVX512) before including this header, so no copy of these inline functions is
// ever built with other flags.
#pragma once

#include <immintrin.h>

#include <type_traits>

// The loops over a register block's vectors, rows and accumulators (the GEMV tiles, the delta rule's and attention's
// blocks) must unroll with compile-time bounds: with a run-time vector count GCC keeps the Vec arrays on the stack
// (copying blocks in and out with memcpy), and every FMA waits on a store and a load (the delta rule's chunk measured
// 2-5x slower so on the development VM).
#define KESTREL_SIMD_UNROLL _Pragma("GCC unroll 16")

namespace kestrel::cpu::simd {

// f(std::integral_constant<int, n>) for the run-time n in 1..kMax: a register block's vector count as a compile-time
// constant, so its arrays stay in registers.
template <int kMax, class F>
__attribute__((always_inline)) inline void with_vecs(int n, F&& f) {
  if constexpr (kMax >= 1) {
    if (n == kMax) {
      f(std::integral_constant<int, kMax>{});
    } else {
      with_vecs<kMax - 1>(n, f);
    }
  }
}

#ifdef KESTREL_SIMD_AVX2
struct F32x8 {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec fnma(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
  // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
  static float hsum(Vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};
#endif

#ifdef KESTREL_SIMD_AVX512
struct F32x16 {
  using Vec = __m512;
  static constexpr int kLanes = 16;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec fnma(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
  // (lanes 0..7 + lanes 8..15), then F32x8's order within the 8.
  static float hsum(Vec v) {
    const __m512 swapped = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(swapped));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};
#endif

}  // namespace kestrel::cpu::simd
