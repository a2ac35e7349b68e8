// gemm_imma: GEMV v4's arithmetic (gemv_imma.h) for many vectors at once — a prompt pass's projections and its MoE
// experts — on re-tiled Q4_0, Q4_K, Q5_K, Q6_K and Q8_0 weights and the same prepared activations
// (gemv_imma_prepare_x).
//
// gemv_imma serves up to 32 vectors a call in segments of 8, each warp holding one row group for one segment, so
// 512 prompt rows read and decode every weight tile 64 times. Here a warp holds four row groups (64 rows) for one
// segment of 8 vectors: each 64-column unit of weights is loaded and its nibbles split once for the four pairs, and
// each pair's activation fragment once for the four row groups. Four warps a block (256 rows × one segment), two
// blocks an SM; the blocks of one row tile are adjacent in the grid, so a tile comes from DRAM once and from L2 for the
// other segments.
//
// Per output the operations are gemv_imma's with one slice (S = 1): integer block sums, the block's or super-block's
// scales in f32, the group scale once per 256 columns, the four digits joined at the end. So the result is within
// gemv_imma's bound of the reference (test_gemv_imma holds it to the same one) but not bit-identical to a gemv_imma
// call that splits the row over several warps. No atomics: runs are bit-identical and y[v] does not depend on n_vec or
// on the other segments.
//
// GemmDigits::kTwo multiplies only the prepared activations' first two digits: each activation is then x rounded to
// the nearest multiple of 2^(e − 13), where 2^e bounds its 256-element group's largest magnitude (gemv_imma_prepare_x's
// digits are successive roundings, so the first two are that rounding). An MMA then holds four vectors instead of
// two: half the MMAs and half the scalings per output. The error against the exact product is at most
// Σ_groups 2^(e_g − 14) · Σ_(k in g) |w_k| plus the f32 sums' rounding: a step of at most 1/4096 of the group's
// largest magnitude (f16 activations' 11-bit significands round a group's large elements more coarsely; 8-bit
// activations in blocks of 32 step by 1/127 of their block's largest).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "gpu/kernels/gemv_imma.h"    // ImmaSegment, imma_x_bytes, gemv_imma_prepare_x
#include "gpu/memory/tiled_matrix.h"  // TiledView

namespace kestrel::gpu {

// GemmDigits (gpu/kernels/tuning.h) is the activation digits gemm_imma multiplies (above).
inline bool gemm_digits_valid(GemmDigits d) { return d == GemmDigits::kFour || d == GemmDigits::kTwo; }

// True when gemm_imma and gemm_imma_segments take the shape: Q4_0, Q4_K, Q5_K, Q6_K or Q8_0, gemv_imma_supports, n_cols
// a multiple of 256.
bool gemm_imma_supports(GgmlType type, int64_t n_cols, int64_t n_rows);

// y[v] = W x[v] for v < n_vec (n_vec >= 1): xprep holds n_vec prepared vectors of w.n_cols (gemv_imma_prepare_x,
// earlier on `stream`); y: device f32 [n_vec, w.n_rows], not overlapping xprep. Errors are found before the launch
// and leave y untouched; otherwise one kernel is enqueued. Thread-safe.
Status gemm_imma(const TiledView& w, const void* xprep, int n_vec, float* y, cudaStream_t stream,
                 GemmDigits digits = GemmDigits::kFour);

// The grouped form, as gemv_imma_segments (same table, same contract for vec/out entries and n_used): each segment's
// matrix times its up to kImmaSegmentVectors vectors, y[out[j] · y_stride + r]. One kernel; thread-safe.
Status gemm_imma_segments(GgmlType type, int64_t n_cols, int64_t n_rows, const ImmaSegment* segments, int n_segments,
                          const void* xprep, float* y, int64_t y_stride, cudaStream_t stream,
                          const int32_t* n_used = nullptr, GemmDigits digits = GemmDigits::kFour);

}  // namespace kestrel::gpu
