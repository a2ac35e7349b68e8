// AVX2 + FMA attention kernel (attend.h, attend_simd.h): 8-lane f32, 8 output vectors per pass over the positions.
// Compiled with the AVX2 GEMV file's flags (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx2).
#define KESTREL_SIMD_AVX2
#include "cpu/simd_f32.h"

#define KESTREL_ATTEND_NS avx2_attend
#include "cpu/attend_simd.h"

namespace kestrel::cpu {
namespace avx2_attend {
namespace {

struct Simd : simd::F32x8 {
  static constexpr int kBlockVecs = 8;
};

}  // namespace
}  // namespace avx2_attend

extern const AttendFn kAttendAvx2;
const AttendFn kAttendAvx2 = avx2_attend::attend<avx2_attend::Simd>;

}  // namespace kestrel::cpu
