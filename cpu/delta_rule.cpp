// Delta rule kernel lookup by level and head size (delta_rule.h); the kernels are in delta_rule_<isa>.cpp.
#include "cpu/delta_rule.h"

namespace kestrel::cpu {

extern const DeltaRuleKernels kDeltaRuleScalar;
extern const DeltaRuleKernels kDeltaRuleAvx2;
extern const DeltaRuleKernels kDeltaRuleAvx512;

DeltaRuleKernels delta_rule_kernels(Isa isa, int d_k, int d_v) {
  switch (isa) {
    case Isa::kAvx512:
      if (d_k % 16 == 0 && d_v % 16 == 0) return kDeltaRuleAvx512;
      break;
    case Isa::kAvx2:
    case Isa::kAvxVnni:  // no delta rule kernels of its own: VNNI is integer only
      if (d_k % 8 == 0 && d_v % 8 == 0) return kDeltaRuleAvx2;
      break;
    case Isa::kScalar: break;
  }
  return kDeltaRuleScalar;
}

}  // namespace kestrel::cpu
