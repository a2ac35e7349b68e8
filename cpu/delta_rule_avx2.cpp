// AVX2 + FMA delta rule kernels (delta_rule.h, delta_rule_simd.h): 8-lane f32, two vectors of a row per
// accumulator row (16 registers). Compiled with -mavx2 -mfma -mf16c -ffp-contract=off (cpu/CMakeLists.txt); called
// only when isa_supported(Isa::kAvx2).
#include <immintrin.h>

#define KESTREL_DR_NS avx2_dr
#include "cpu/delta_rule_simd.h"

namespace kestrel::cpu {
namespace avx2_dr {
namespace {

struct Simd {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kBlockVecs = 2;
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

}  // namespace
}  // namespace avx2_dr

extern const DeltaRuleKernels kDeltaRuleAvx2;
const DeltaRuleKernels kDeltaRuleAvx2 = avx2_dr::make_kernels<avx2_dr::Simd>();

}  // namespace kestrel::cpu
