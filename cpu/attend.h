// Causal softmax attention of one query head over a session's KV cache on the CPU (model-spec.md §4;
// ref::attend_head's contract), one translation unit per instruction-set level (attend_scalar.cpp, attend_avx2.cpp,
// attend_avx512.cpp), chosen with the GEMV level (isa.h):
//
//   scalar: ref::attend_head's operations in its order (dot_f32, softmax, the weighted sum position by position),
//           with a per-thread score buffer instead of one allocated per call.
//   SIMD:   the scores as FMA dot products over the head's dims (two accumulators, a fixed-order horizontal sum),
//           ref::softmax, then the weighted sum of V rows accumulated in registers, a block of the head's dims at a
//           time, positions in order. The reference up to f32 summation order (tests/cpu/test_cpu_attend).
//
// Each call is a fixed sequence of operations on its own inputs, so a (token, head)'s result does not depend on
// threads, batch or the other heads. The SIMD kernels need head_dim a multiple of 16 (avx512) or 8 (avx2);
// attend_kernel() returns the scalar one for other sizes. Threading: pure apart from a per-thread score buffer of
// n_pos floats (thread_local, grown once).
#pragma once

#include "core/reference/kv_cache.h"
#include "cpu/isa.h"

namespace kestrel::cpu {

// out [head_dim] = softmax(q · K[p] · scale for p < n_pos) · V over kv head kv_head of cache; q [head_dim].
using AttendFn = void (*)(const ref::KvCache& cache, int kv_head, int n_pos, const float* q, float scale, float* out);

// The kernel of `isa` for heads of head_dim (the scalar one where the level's needs another size).
AttendFn attend_kernel(Isa isa, int head_dim);

}  // namespace kestrel::cpu
