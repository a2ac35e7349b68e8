// AVX-512 GEMV kernels (gemv.h): the block-quantized types on int8 activations with VNNI (gemv_q8_avx512.h), and
// every type on f32 activations with 16-lane f32 accumulators over the AVX2 decoders (gemv_simd.h). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512bf16 -mavx2 -mfma -mf16c -ffp-contract=off
// (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx512).
#define KESTREL_GEMV_NS avx512
#include "cpu/gemv_simd.h"
// Must follow gemv_simd.h.
#include "cpu/gemv_q8_avx512.h"

namespace kestrel::cpu {
namespace avx512 {
namespace {

struct Simd {
  using Vec = __m512;
  static constexpr int64_t kLanes = 16;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec loadu(const float* p) { return _mm512_loadu_ps(p); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  // The two 256-bit halves added, then the AVX2 order of hsum.
  static float hsum(Vec v) {
    const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), upper);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace
}  // namespace avx512

extern const GemvKernels kGemvAvx512;
const GemvKernels kGemvAvx512 = [] {
  GemvKernels k = avx512::make_kernels<avx512::Simd>();
  k.q8_0.on_q8 = avx512::gemv_q8<avx512::FmtQ8_0>;
  k.q4_0.on_q8 = avx512::gemv_q8<avx512::FmtQ4_0>;
  k.q4_k.on_q8 = avx512::gemv_q8<avx512::FmtK45<false>>;
  k.q5_k.on_q8 = avx512::gemv_q8<avx512::FmtK45<true>>;
  k.q6_k.on_q8 = avx512::gemv_q8<avx512::FmtQ6_K>;
  return k;
}();

}  // namespace kestrel::cpu
