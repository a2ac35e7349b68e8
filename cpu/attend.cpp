// Attention kernel lookup by level and head size (attend.h); the kernels are in attend_<isa>.cpp.
#include "cpu/attend.h"

namespace kestrel::cpu {

extern const AttendFn kAttendScalar;
extern const AttendFn kAttendAvx2;
extern const AttendFn kAttendAvx512;

AttendFn attend_kernel(Isa isa, int head_dim) {
  switch (isa) {
    case Isa::kAvx512:
      if (head_dim % 16 == 0) return kAttendAvx512;
      break;
    case Isa::kAvx2:
    case Isa::kAvxVnni:  // no attention kernel of its own: VNNI is integer only
      if (head_dim % 8 == 0) return kAttendAvx2;
      break;
    case Isa::kScalar: break;
  }
  return kAttendScalar;
}

}  // namespace kestrel::cpu
