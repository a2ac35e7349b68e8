// AVX-512 attention kernel (attend.h, attend_simd.h): 16-lane f32, 8 output vectors per pass over the positions.
// Compiled with the AVX-512 GEMV file's flags (cpu/CMakeLists.txt); called only when isa_supported(Isa::kAvx512).
#define KESTREL_SIMD_AVX512
#include "cpu/simd_f32.h"

#define KESTREL_ATTEND_NS avx512_attend
#include "cpu/attend_simd.h"

namespace kestrel::cpu {
namespace avx512_attend {
namespace {

struct Simd : simd::F32x16 {
  static constexpr int kBlockVecs = 8;
};

}  // namespace
}  // namespace avx512_attend

extern const AttendFn kAttendAvx512;
const AttendFn kAttendAvx512 = avx512_attend::attend<avx512_attend::Simd>;

}  // namespace kestrel::cpu
