// AVX-512 attention kernel (attend.h, attend_simd.h): 16-lane f32, 8 output vectors per pass over the positions.
// Compiled with the AVX-512 GEMV file's flags (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx512).
#include <immintrin.h>

#define KESTREL_ATTEND_NS avx512_attend
#include "cpu/attend_simd.h"

namespace kestrel::cpu {
namespace avx512_attend {
namespace {

struct Simd {
  using Vec = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kBlockVecs = 8;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  // (lanes 0..7 + lanes 8..15), then the AVX2 order within the 8.
  static float hsum(Vec v) {
    const __m512 swapped = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(swapped));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace
}  // namespace avx512_attend

extern const AttendFn kAttendAvx512;
const AttendFn kAttendAvx512 = avx512_attend::attend<avx512_attend::Simd>;

}  // namespace kestrel::cpu
