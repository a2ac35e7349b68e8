// The gated delta rule of one V-head on the CPU (model-spec.md §3.5, §3.6): the recurrent step for a token and the
// chunked form for a whole chunk of kDeltaRuleChunk tokens, one translation unit per instruction-set level
// (delta_rule_scalar.cpp, delta_rule_avx2.cpp, delta_rule_avx512.cpp), chosen with the GEMV level (isa.h).
//
//   step:  ref::delta_rule_step's contract. scalar: that function itself. SIMD: the state's rows vectorized over
//          dv in two passes (m = Σ_i e^g·S[i]·k_i, then S[i] ← e^g·S[i] + k_i·δ and o += S[i]·q_i) instead of the
//          reference's three column-strided ones; FMA.
//   chunk: exactly kDeltaRuleChunk tokens of ref::delta_rule_chunked's math from any incoming state. scalar: that
//          function on the gathered chunk. SIMD: the same steps with every product vectorized over the contiguous
//          dimension and register-blocked 4 rows at a time (W S, (Q⊙e^G) S and the state update are each
//          C·dk·dv multiply-adds, ~1.4× the recurrent form's count but at FMA rate instead of an L2 pass over
//          the 64 KiB state per token).
// Both agree with the reference to f32 rounding (tests/cpu/test_delta_rule), and each is a fixed sequence of
// operations, so results do not depend on threads or on what else runs.
//
// The SIMD kernels need d_k and d_v to be multiples of 16 (avx512) or 8 (avx2); delta_rule_kernels() returns the
// scalar ones for other sizes. Threading: pure apart from the state they update and a per-thread scratch of
// ~(2·C² + C·(dk + 2·dv)) floats (thread_local, grown once), so distinct heads may run on distinct threads.
#pragma once

#include <cstdint>

#include "core/reference/delta_rule.h"
#include "cpu/isa.h"

namespace kestrel::cpu {

inline constexpr int kDeltaRuleChunk = ref::kDeltaRuleChunk;

// One chunk's inputs and outputs, token rows strided: token t's q̂ at q + t·qk_stride (k̂ likewise), v at
// v + t·v_stride, g and beta at g[t·gate_stride], beta[t·gate_stride], o written at o + t·o_stride.
struct DeltaRuleChunk {
  const float* q = nullptr;
  const float* k = nullptr;
  int64_t qk_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t gate_stride = 0;
  float* o = nullptr;
  int64_t o_stride = 0;
};

using DeltaRuleStepFn = void (*)(const float* q, const float* k, const float* v, float g, float beta, int d_k, int d_v,
                                 float* s, float* o);
// s: f32 [dk][dv] in/out.
using DeltaRuleChunkFn = void (*)(const DeltaRuleChunk& c, int d_k, int d_v, float* s);

struct DeltaRuleKernels {
  DeltaRuleStepFn step = nullptr;
  DeltaRuleChunkFn chunk = nullptr;
};

// The kernels of `isa` for heads of d_k × d_v (the scalar ones where the level's need other sizes).
DeltaRuleKernels delta_rule_kernels(Isa isa, int d_k, int d_v);

}  // namespace kestrel::cpu
