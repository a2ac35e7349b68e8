// AVX2 + AVX-VNNI GEMV kernels (gemv.h): the avx2 level's kernels (gemv_simd.h, gemv_q8_avx2.h) with the int8 dot
// products on vpdpbusd / vpdpwssd instead of vpmaddubsw + vpmaddwd + vpaddd — the same int32 values, so the same
// bits as avx2, in fewer instructions. Compiled with -mavx2 -mfma -mf16c -mavxvnni
// -ffp-contract=off (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvxVnni).
#define KESTREL_GEMV_NS avxvnni
#include "cpu/gemv_simd.h"
// Must follow gemv_simd.h.
#include "cpu/gemv_q8_avx2.h"

namespace kestrel::cpu {
namespace avxvnni {
namespace {

struct Simd {
  using Vec = __m256;
  static constexpr int64_t kLanes = 8;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static float hsum(Vec v) { return hsum8(v); }
};

struct DotVnni {
  static __m256i u8(__m256i acc, __m256i u, __m256i q) { return _mm256_dpbusd_avx_epi32(acc, u, q); }
  static __m256i i16(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
};

}  // namespace
}  // namespace avxvnni

extern const GemvKernels kGemvAvxVnni;
const GemvKernels kGemvAvxVnni = [] {
  GemvKernels k = avxvnni::make_kernels<avxvnni::Simd>();
  avxvnni::add_q8_kernels<avxvnni::DotVnni>(k);
  return k;
}();

}  // namespace kestrel::cpu
