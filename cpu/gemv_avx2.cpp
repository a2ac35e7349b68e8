// AVX2 + FMA + F16C GEMV kernels (gemv.h): the block-quantized types on int8 activations with vpmaddubsw /
// vpmaddwd (gemv_q8_avx2.h), and every type on f32 activations with 8-lane f32 accumulators (gemv_simd.h). Compiled
// with -mavx2 -mfma -mf16c -ffp-contract=off (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx2).
#define KESTREL_GEMV_NS avx2
#include "cpu/gemv_simd.h"
// Must follow gemv_simd.h.
#include "cpu/gemv_q8_avx2.h"

namespace kestrel::cpu {
namespace avx2 {
namespace {

struct Simd {
  using Vec = __m256;
  static constexpr int64_t kLanes = 8;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
  static float hsum(Vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace
}  // namespace avx2

extern const GemvKernels kGemvAvx2;
const GemvKernels kGemvAvx2 = [] {
  GemvKernels k = avx2::make_kernels<avx2::Simd>();
  avx2::add_q8_kernels<avx2::DotMaddubs>(k);
  return k;
}();

}  // namespace kestrel::cpu
