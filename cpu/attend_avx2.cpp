// AVX2 + FMA attention kernel (attend.h, attend_simd.h): 8-lane f32, 8 output vectors per pass over the positions.
// Compiled with the AVX2 GEMV file's flags (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx2).
#include <immintrin.h>

#define KESTREL_ATTEND_NS avx2_attend
#include "cpu/attend_simd.h"

namespace kestrel::cpu {
namespace avx2_attend {
namespace {

struct Simd {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kBlockVecs = 8;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(Vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace
}  // namespace avx2_attend

extern const AttendFn kAttendAvx2;
const AttendFn kAttendAvx2 = avx2_attend::attend<avx2_attend::Simd>;

}  // namespace kestrel::cpu
