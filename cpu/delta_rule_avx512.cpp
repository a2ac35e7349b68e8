// AVX-512 delta rule kernels (delta_rule.h, delta_rule_simd.h): 16-lane f32, four vectors of a row per accumulator
// row (32 registers). Compiled with the AVX-512 GEMV file's flags (cpu/CMakeLists.txt); called only when
// isa_supported(Isa::kAvx512).
#define KESTREL_SIMD_AVX512
#include "cpu/simd_f32.h"

#define KESTREL_DR_NS avx512_dr
#include "cpu/delta_rule_simd.h"

namespace kestrel::cpu {
namespace avx512_dr {
namespace {

struct Simd : simd::F32x16 {
  static constexpr int kBlockVecs = 4;
};

}  // namespace
}  // namespace avx512_dr

extern const DeltaRuleKernels kDeltaRuleAvx512;
const DeltaRuleKernels kDeltaRuleAvx512 = avx512_dr::make_kernels<avx512_dr::Simd>();

}  // namespace kestrel::cpu
