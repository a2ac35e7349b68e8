// gemv_imma: GEMV v4 for Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 weights in the re-tiled layout of tiled_matrix.h
// (tile_matrix: the same bytes, reordered so one 16-byte load per lane feeds tensor-core fragments), on the integer
// tensor cores.
//
// Arithmetic: the 4-bit quants enter a u8 × s8 MMA (m16n8k32) unchanged — the tile words already hold, per lane, the
// A-fragment bytes of two 32-element blocks, one AND (and one shift) per 8 quants. Each f32 activation is written
// once per x (gemv_imma_prepare_x) as four signed 7-bit digits of a power-of-two scale per 256 elements:
//   x = s_G · (d0 + d1/128 + d2/128² + d3/128³) + e,  s_G = 2^(E−6) for the group's largest |x| = m·2^E,
//   |d| <= 64, |e| <= 2^−22 · s_G < 2^−27 · max|x_G|
// (the digits are exact for every element within 2^4 of the group's largest; smaller ones keep >= 22 bits). The four
// digits of a vector are four MMA columns, so one MMA serves two vectors; every integer sum is exact and each
// 32-element block's sum is scaled in f32 (Q4_0: d·(Σq·x − 8·Σx); Q4_K: d·sc, dmin·m per sub-block, exact int32
// sums over the super-block). Q5_K: Q4_K's with the fifth bit OR-ed into each A byte, sums kept per digit; Q8_0: the
// int8 block as s8 A registers (s8 × s8), Q6_K: q − 32 built as a signed byte, one m16n8k16 MMA per 16-element
// sub-block (its int8 scale), per-digit int32 sums — these join their digit columns in f32 with one rounding.
// Agreement with ref::matvec_batch: the test holds 1e-5 of Σ|w·x| (measured ~1e-7).
//
// Work split: one warp streams a row group (16 rows) × 256 columns (4 tiles, one scale group / Q4_K super-block)
// per round; the S warps of a row group (S from the shape alone) sit in one block and their partial sums are added
// in warp order through shared memory. No atomics: runs are bit-identical, y[v] does not depend on n_vec, and a
// grouped call's segment does not depend on the other segments or the table's length.
// docs/gpu.md ("GEMV v4") has the derivation, dev/notes/gpu-kernels.md the measurements behind its choices.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "gpu/kernels/tuning.h"       // GemvImmaTuning
#include "gpu/memory/tiled_matrix.h"  // TiledView, tile_matrix

namespace kestrel::gpu {

// Longest row gemv_imma and gemv_imma_segments take.
inline constexpr int64_t kImmaMaxCols = 8192;

// True when gemv_imma takes this tiled matrix: tiled_supports() and n_cols <= kImmaMaxCols.
bool gemv_imma_supports(GgmlType type, int64_t n_cols, int64_t n_rows);

// Bytes of the prepared form of n_vec vectors of n_cols elements (n_cols a multiple of 64); 0 when out of range.
uint64_t imma_x_bytes(int64_t n_cols, int n_vec);

// x: device f32 [n_vec, n_cols], 16-byte aligned; xprep: device, imma_x_bytes() bytes, 16-byte aligned.
// n_cols a multiple of 64 up to kImmaMaxCols, n_vec in [1, 65535]. A group holding a non-finite value gets a NaN scale
// (its outputs become NaN). Enqueues one small kernel; thread-safe; returns without waiting.
Status gemv_imma_prepare_x(const float* x, int64_t n_cols, int n_vec, void* xprep, cudaStream_t stream);

// The prepared form of the SwiGLU activations act[v] = silu(gate[v]) ⊙ up[v], silu(g) = g · (1 / (1 + e^−g)) as
// ref::swiglu_forward (device expf), without storing act: gate and up are device f32 [n_vec, n_cols] (rows
// n_cols apart), 16-byte aligned; otherwise as gemv_imma_prepare_x (which it equals on act). programmatic: launched
// as a programmatic dependent of the kernel before it (gpu/kernels/pdl.cuh: the launches overlap, the results do not
// change). hold_dependents: the kernel lets the next one launch only after its own wait, so that everything the kernels
// before the one before it wrote is final when the next kernel starts (gemv_imma_segments' table_settled).
Status gemv_imma_prepare_swiglu(const float* gate, const float* up, int64_t n_cols, int n_vec, void* xprep,
                                cudaStream_t stream, bool programmatic = false, bool hold_dependents = false);

// One piece of a grouped GEMV (gemv_imma_segments): a tiled matrix (tile_matrix output, on the device; n_rows × n_cols
// as given to the call, the same for every segment) and up to kImmaSegmentVectors prepared vectors it multiplies:
//   y[out[j] * y_stride + r] = (W x[vec[j]])[r]   for j < n_vec, r < n_rows.
// The matrix is read once for all its vectors. A table of these may be written by a kernel (e.g. from the MoE
// routing) before the GEMV runs on the same stream.
inline constexpr int kImmaSegmentVectors = 8;
struct ImmaSegment {
  const void* data = nullptr;             // tiled matrix, 16-byte aligned
  int32_t n_vec = 0;                      // 0 .. kImmaSegmentVectors (0: the segment is skipped)
  int32_t vec[kImmaSegmentVectors] = {};  // indices of prepared vectors in xprep (< n_x)
  int32_t out[kImmaSegmentVectors] = {};  // output rows of y (< n_y, the caller's bound)
  int32_t pad_ = 0;
};
static_assert(sizeof(ImmaSegment) == 80, "ImmaSegment is a POD a device kernel writes");

// Grouped GEMV over n_segments segments (device table `segments`, device memory): every segment's matrix has the
// shape {n_cols, n_rows} and type `type` (gemv_imma_supports); xprep holds n_x
// prepared vectors of n_cols (gemv_imma_prepare_x with n_vec = n_x); y: device f32, rows of y_stride >= n_rows
// floats. Out-of-range vec/out entries are the table writer's responsibility: the kernel does not check them (it
// clamps nothing). max_segment_vectors (1..8): a bound on every segment's n_vec that the table writer guarantees (e.g.
// the token count of an MoE call); a smaller bound runs a kernel with fewer registers — a segment with more vectors
// than the bound has the excess ignored, so the bound is part of the table's contract like vec/out. Same arithmetic
// as gemv_imma; grouped calls split a row into slices of at most 4 groups, so S (and the last bits) may differ from
// a dense call's. One kernel; thread-safe. programmatic: as gemv_imma_prepare_swiglu. n_used (optional, device
// int32, written before the GEMV runs, e.g. by the table's writer): only the first min(*n_used, n_segments) segments
// are read, the rest of the table may be left unwritten (a table sized for the worst case walks only what it holds).
// table_settled (with programmatic): the table is final before this kernel can launch — written by a kernel that
// completed before the kernel just before this one returned from its programmatic wait, and that kernel triggers its
// dependents only after that wait (e.g. gemv_imma_prepare_swiglu's hold_dependents) — so the kernel reads its first
// entries and weights before its own wait, overlapping the kernel before. The bits do not change. tuning: the split
// by shape and the compiled kernels unless it forces others (gpu/kernels/tuning.h).
Status gemv_imma_segments(GgmlType type, int64_t n_cols, int64_t n_rows, const ImmaSegment* segments, int n_segments,
                          const void* xprep, float* y, int64_t y_stride, cudaStream_t stream,
                          int max_segment_vectors = kImmaSegmentVectors, bool programmatic = false,
                          const int32_t* n_used = nullptr, bool table_settled = false,
                          const GemvImmaTuning& tuning = {});

// The pointer checks of a dense call on the prepared form (gemv_imma, gemm_imma): w.data and xprep non-null and 16-byte
// aligned, y non-null and 4-byte aligned, and y's n_vec rows of w.n_rows floats not overlapping xprep's n_vec
// prepared vectors. kInvalidArgument naming `op` otherwise.
Status imma_dense_pointers_check(const char* op, const TiledView& w, const void* xprep, int n_vec, const float* y);

// y[v] = W x[v] with x prepared by gemv_imma_prepare_x (same n_cols, at least n_vec vectors, earlier on `stream`).
// y: device f32 [n_vec, n_rows], 4-byte aligned, not overlapping xprep; n_vec in [1, 32]. Errors are found before
// the launch and leave y untouched; otherwise one kernel is enqueued and the call returns without waiting.
// Thread-safe. programmatic: launched as a programmatic dependent of the kernel before it (gpu/kernels/pdl.cuh); its
// first weight loads then overlap that kernel's end (w must not be written by any kernel while resident), and the
// results do not change. tuning: the split by shape and the flat and compiled kernels unless it forces others
// (gpu/kernels/tuning.h).
Status gemv_imma(const TiledView& w, const void* xprep, int n_vec, float* y, cudaStream_t stream,
                 bool programmatic = false, const GemvImmaTuning& tuning = {});

}  // namespace kestrel::gpu
