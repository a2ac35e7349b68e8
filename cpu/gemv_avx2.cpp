// AVX2 + FMA + F16C GEMV kernels (gemv.h): the block-quantized types on int8 activations with vpmaddubsw /
// vpmaddwd (gemv_q8_avx2.h), and every type on f32 activations with 8-lane f32 accumulators (gemv_simd.h). Compiled
// with -mavx2 -mfma -mf16c -ffp-contract=off (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx2).
#define KESTREL_SIMD_AVX2
#include "cpu/simd_f32.h"

#define KESTREL_GEMV_NS avx2
#include "cpu/gemv_simd.h"
// Must follow gemv_simd.h.
#include "cpu/gemv_q8_avx2.h"

namespace kestrel::cpu {
namespace avx2 {
namespace {

// The 8-lane f32 traits.
using Simd = simd::F32x8;

}  // namespace
}  // namespace avx2

extern const GemvKernels kGemvAvx2;
const GemvKernels kGemvAvx2 = [] {
  GemvKernels k = avx2::make_kernels<avx2::Simd>();
  avx2::add_q8_kernels<avx2::DotMaddubs>(k);
  return k;
}();

}  // namespace kestrel::cpu
