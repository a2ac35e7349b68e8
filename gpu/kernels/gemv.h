// gemv: y[v] = W x[v] for up to 32 f32 activation vectors sharing one read of a weight kept on the device in its raw
// GGUF block layout (batched decode; model-spec.md §6.2 shapes, §6.4 types).
//
// Types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. Each weight element is dequantized exactly as core's
// dequantize_row (gpu/kernels/dequant.cuh) and multiplied into an f32 accumulator; only the summation order differs
// from ref::matvec_batch (per-lane strided partial sums, then a fixed butterfly reduction), so results agree with it to
// ~1e-5 of Σ|w·x| and are bit-identical from run to run, and each y[v] does not depend on n_vec.
// docs/gpu.md ("GEMV over raw blocks") describes the layout and the launch shape.
#pragma once

#include <cuda_runtime.h>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "gpu/kernels/device_views.h"

namespace kestrel::gpu {

// Most activation vectors one gemv call takes.
inline constexpr int kGemvMaxVectors = 32;

bool gemv_supports(GgmlType type);

// w: n_rows (= n_out) rows of n_cols (= n_in) elements, device, 2-byte aligned (4 for F32);
// x: device f32 [n_vec, n_cols], 4-byte aligned; y: device f32 [n_vec, n_rows], 4-byte aligned, must not overlap x.
// n_vec in [1, kGemvMaxVectors]. Errors (kUnsupported type, kInvalidArgument for shape/pointer/alignment/n_vec)
// are found before the launch and leave y untouched; otherwise one kernel is enqueued on `stream` and the call
// returns without waiting. An empty matrix (n_rows == 0) launches nothing; n_cols == 0 writes zeros.
// Thread-safe (no shared state); the caller keeps w, x and y alive until the stream has run.
Status gemv(const DeviceMatrixView& w, const float* x, int n_vec, float* y, cudaStream_t stream);

}  // namespace kestrel::gpu
