// Matrix × 1..n activation vectors over raw GGUF weight blocks, one read of the weights for all vectors.
//
//   y[v][o] = Σ_i W[o][i] · x[v][i]      W: the raw rows of a ref::QuantMatrix (never widened in memory)
//
// Types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. Each instruction-set level (isa.h) has its own kernels, and
// each kernel takes its activations in one of three forms (GemvInput):
// - kF32: x itself. scalar: each block is dequantized with core/quant into a 256-element stack tile and dotted in
//   index order with one f32 accumulator, bit-identical to ref::matvec_batch. avx2, avxvnni (avx2's) and avx512: blocks
//   decoded into the same tile with SIMD (exactly core/quant's values) and multiplied into f32 with FMA, four vector
//   accumulators per vector, reduced in a fixed order — the reference up to summation order.
// - kQ8 and kQ8K: x quantized to int8 per 32- or per 256-element block (act_q8.h), read by the int8 kernels of the
//   block-quantized types: avx512's (gemv_q8_avx512.h) all on kQ8, avx2's and avxvnni's (gemv_q8_avx2.h, the same
//   kernels on other instructions for the same integer products) Q4_0 / Q8_0 on kQ8 and the K-quants on kQ8K. Integer
//   dot products exact in integers (several times the f32 kernels' throughput: docs/benchmarks.md), combined in f32 —
//   the reference applied to x̃ (the dequantized activations) up to summation order. The scalar level has none (its
//   types run on kF32). The caller (MatmulRunner) quantizes x into task.xq in the form the kernel reads.
//
// Determinism: a row's result depends only on that row's weights, the vector and the level: not on n_vec, on which
// rows another call computes, nor on the thread that runs it. Callers split rows across threads freely.
// Thread-safety: pure functions over read-only weights; distinct row ranges may run concurrently into one y.
#pragma once

#include <cstdint>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/reference/matvec.h"
#include "cpu/act_q8.h"
#include "cpu/isa.h"

namespace kestrel::cpu {

// One product. x: f32 [n_vec, n_in] — or, with x_rows, f32 [x_count, n_in] of which vector v is row x_rows[v] (the
// rows of a batch that chose one expert, without copying them out); y: f32 [n_vec, n_out] (must not alias x). xq: x
// quantized (act_q8.h, all of x's rows), read by kQ8 / kQ8K kernels only. w_up: read by MatmulRunner only (matmul.h).
struct GemvTask {
  GgmlType type = GgmlType::kF32;
  const uint8_t* w = nullptr;  // n_out rows of row_bytes
  uint64_t row_bytes = 0;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const float* x = nullptr;
  const int32_t* x_rows = nullptr;  // int32 [n_vec], or nullptr: vector v is row v
  int64_t x_count = 0;              // rows of x when x_rows is set
  ActQ8View xq;
  int64_t n_vec = 0;
  float* y = nullptr;
  const uint8_t* w_up = nullptr;  // a second matrix shaped as w: y = silu(W x) · (W_up x)
};

// The row of x (and of xq) that vector v of a task reads.
inline int64_t gemv_x_row(const GemvTask& t, int64_t v) { return t.x_rows != nullptr ? t.x_rows[v] : v; }

// Computes rows [row_begin, row_end) of y for every vector.
using GemvRowsFn = void (*)(const GemvTask& task, int64_t row_begin, int64_t row_end);

// Which form of the activations a kernel reads; as a caller's preference, kQ8 asks for int8 in whichever form the
// type's kernel reads.
enum class GemvInput {
  kF32,  // task.x
  kQ8,   // task.xq, per 32-element block (q, dl, ns4, ds)
  kQ8K,  // task.xq, per 256-element super-block (qk, dk, bsum)
};

// A type's kernels at one level, by the form of activations they read (nullptr: none).
struct GemvTypeKernels {
  GemvRowsFn on_f32 = nullptr;
  GemvRowsFn on_q8 = nullptr;          // int8 activations, in the form q8_form
  GemvInput q8_form = GemvInput::kQ8;  // kQ8 or kQ8K
};

// The kernels of one level, by weight type.
struct GemvKernels {
  GemvTypeKernels f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k;
};

struct GemvKernel {
  GemvRowsFn fn = nullptr;  // nullptr: the level has no kernel for the type
  GemvInput input = GemvInput::kF32;
};

// The table of a level (each defined in its own translation unit). Calling a kernel of a level the CPU lacks
// (isa_supported() false) is undefined.
const GemvKernels& gemv_kernels(Isa isa);

// The kernel for `type` at `isa`: the int8 one (input kQ8 or kQ8K) when `prefer` is not kF32 and the level has
// it, else the kF32 one (fn nullptr when the type has none).
GemvKernel gemv_kernel(Isa isa, GgmlType type, GemvInput prefer);

// Whether a weight type has kernels (the same set at every level).
bool gemv_supports(GgmlType type);

// The task of W x for a checked matrix: kUnsupported for a type without kernels, kInvalidArgument for an n_in that
// is not a whole number of blocks or a missing data pointer.
Expected<GemvTask> gemv_task(const ref::QuantMatrix& w, const float* x, int64_t n_vec, float* y);

}  // namespace kestrel::cpu
