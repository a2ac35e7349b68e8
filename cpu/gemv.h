// Matrix × 1..n activation vectors over raw GGUF weight blocks, one read of the weights for all vectors.
//
//   y[v][o] = Σ_i W[o][i] · x[v][i]      W: the raw rows of a ref::QuantMatrix (never widened in memory)
//
// Types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. Each instruction-set level (isa.h) has its own kernels:
// - scalar: each block is dequantized with core/quant into a 256-element stack tile and dotted in index order with
//   one f32 accumulator, so its results are bit-identical to ref::matvec_batch;
// - avx2 / avx512: blocks are decoded into the same tile with SIMD (exactly core/quant's values: one multiply and
//   one subtraction per element, no fused rounding) and multiplied into f32 with FMA, four vector accumulators per
//   activation vector, reduced in a fixed order at the end of the row.
// Activations stay f32 (no int8 quantization), so the only difference from the reference is the summation order.
//
// Determinism: a row's result depends only on that row's weights, the vector and the level: not on n_vec, on which
// rows another call computes, nor on the thread that runs it. Callers split rows across threads freely.
// Thread-safety: pure functions over read-only weights; distinct row ranges may run concurrently into one y.
#pragma once

#include <cstdint>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/reference/matvec.h"
#include "cpu/isa.h"

namespace kestrel::cpu {

// One product. x: f32 [n_vec, n_in]; y: f32 [n_vec, n_out] (must not alias x).
struct GemvTask {
  GgmlType type = GgmlType::kF32;
  const uint8_t* w = nullptr;  // n_out rows of row_bytes
  uint64_t row_bytes = 0;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const float* x = nullptr;
  int64_t n_vec = 0;
  float* y = nullptr;
};

// Computes rows [row_begin, row_end) of y for every vector.
using GemvRowsFn = void (*)(const GemvTask& task, int64_t row_begin, int64_t row_end);

// The kernels of one level, by weight type; nullptr for a type the level does not have.
struct GemvKernels {
  GemvRowsFn f32 = nullptr;
  GemvRowsFn f16 = nullptr;
  GemvRowsFn bf16 = nullptr;
  GemvRowsFn q8_0 = nullptr;
  GemvRowsFn q4_0 = nullptr;
  GemvRowsFn q4_k = nullptr;
  GemvRowsFn q5_k = nullptr;
  GemvRowsFn q6_k = nullptr;
};

// The table of a level (each defined in its own translation unit). Calling a kernel of a level the CPU lacks
// (isa_supported() false) is undefined.
const GemvKernels& gemv_kernels(Isa isa);

// The kernel for `type` at `isa`, or nullptr.
GemvRowsFn gemv_kernel(Isa isa, GgmlType type);

// Whether a weight type has kernels (the same set at every level).
bool gemv_supports(GgmlType type);

// The task of W x for a checked matrix: kUnsupported for a type without kernels, kInvalidArgument for an n_in that
// is not a whole number of blocks or a missing data pointer.
Expected<GemvTask> gemv_task(const ref::QuantMatrix& w, const float* x, int64_t n_vec, float* y);

}  // namespace kestrel::cpu
