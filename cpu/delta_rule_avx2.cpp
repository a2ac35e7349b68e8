// AVX2 + FMA delta rule kernels (delta_rule.h, delta_rule_simd.h): 8-lane f32, two vectors of a row per
// accumulator row (16 registers). Compiled with -mavx2 -mfma -mf16c -ffp-contract=off (cpu/CMakeLists.txt); called
// only when isa_supported(Isa::kAvx2).
#define KESTREL_SIMD_AVX2
#include "cpu/simd_f32.h"

#define KESTREL_DR_NS avx2_dr
#include "cpu/delta_rule_simd.h"

namespace kestrel::cpu {
namespace avx2_dr {
namespace {

struct Simd : simd::F32x8 {
  static constexpr int kBlockVecs = 2;
};

}  // namespace
}  // namespace avx2_dr

extern const DeltaRuleKernels kDeltaRuleAvx2;
const DeltaRuleKernels kDeltaRuleAvx2 = avx2_dr::make_kernels<avx2_dr::Simd>();

}  // namespace kestrel::cpu
