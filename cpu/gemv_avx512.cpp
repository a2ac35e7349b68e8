// AVX-512 GEMV kernels (gemv.h): the block-quantized types on int8 activations with VNNI (gemv_q8_avx512.h), and
// every type on f32 activations with 16-lane f32 accumulators over the AVX2 decoders (gemv_simd.h). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512bf16 -mavx2 -mfma -mf16c -ffp-contract=off
// (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx512).
#define KESTREL_SIMD_AVX512
#include "cpu/simd_f32.h"

#define KESTREL_GEMV_NS avx512
#include "cpu/gemv_simd.h"
// Must follow gemv_simd.h.
#include "cpu/gemv_q8_avx512.h"

namespace kestrel::cpu {
namespace avx512 {
namespace {

// The 16-lane f32 traits (their horizontal sum: the two 256-bit halves added, then the 8-lane order).
using Simd = simd::F32x16;

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
