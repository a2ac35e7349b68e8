// RMSNorm of f32 rows with a weight, and the same fused with the residual add that precedes it (model-spec.md §2).
//
//   rms_norm:              y_r = rms_norm(x_r) · w                       for each of n_rows rows of n elements
//   residual_add_rms_norm: res_r ← res_r + delta_r;  y_r = rms_norm(res_r) · w
// exactly as ref::rms_norm: s = 1 / sqrt(Σ x² / n + eps) in f32, y_i = (x_i · s) · w_i. Only the order of the
// sum of squares differs from the reference (per-thread strided partial sums, then a fixed block reduction,
// gpu/kernels/block_reduce.cuh), so y agrees with ref::rms_norm to a few f32 ulps (tests use 1e-5 relative) and is
// bit-identical from run to run. The fused form is one read of res and delta and one write of res and y instead of
// an add pass plus a norm pass (it is how every layer's attn_norm / post_attention_norm / output_norm follows the
// previous residual add); the residual sum itself is bit-identical to res + delta in f32.
// rms_norm_prepare is either form (delta null: the plain norm, of res, which it leaves alone) and then, when xprep is
// not null, the normalised rows' prepared form for gemv_imma (the bytes gemv_imma_prepare_x writes from y) in the same
// launch: the engine's norm and the preparation of the projections after it in one kernel instead of two; y is
// written too (the residual stream's other readers). With xprep: n a multiple of 64 up to gemv_imma's widest row,
// 1..65535 rows, xprep imma_x_bytes(n, n_rows) bytes and y 16-byte aligned. programmatic: launched as a programmatic
// dependent of the kernel before it (gpu/kernels/pdl.cuh); it reads nothing before the wait. The same bits as the
// two-kernel forms.
// Any n >= 1 (not only multiples of 32) for rms_norm and residual_add_rms_norm. y may equal x (in place) for rms_norm;
// for the fused form y must not overlap res or delta. Each call enqueues one kernel on `stream` (one block per row) and
// returns without waiting; argument errors (kInvalidArgument) are found before the launch. Thread-safe (no shared
// state).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"

namespace kestrel::gpu {

// x, y: device f32 [n_rows, n]; w: device f32 [n].
Status rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y, cudaStream_t stream);

// res: device f32 [n_rows, n], updated in place; delta: device f32 [n_rows, n]; w: f32 [n]; y: f32 [n_rows, n].
Status residual_add_rms_norm(float* res, const float* delta, const float* w, int64_t n_rows, int64_t n, float eps,
                             float* y, cudaStream_t stream);

// res: device f32 [n_rows, n] (updated in place when delta is not null); delta: null or device f32 [n_rows, n];
// w: f32 [n]; y: f32 [n_rows, n]; xprep: null (the norm alone) or imma_x_bytes(n, n_rows) bytes.
Status rms_norm_prepare(float* res, const float* delta, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
                        void* xprep, cudaStream_t stream, bool programmatic);

}  // namespace kestrel::gpu
