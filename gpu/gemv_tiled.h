// gemv_tiled: GEMV v3 for Q4_0 and Q4_K weights re-tiled at load time (no widening: the same bytes, reordered) so
// that one 16-byte load per lane feeds bf16 tensor-core MMAs directly. docs/gpu.md ("GEMV v3") has the derivation.
//
// Layout (q4_tile writes it from raw GGUF rows; both parts together are exactly the raw size):
//   rows in groups of 16 ("row group" rg), columns in units of 64 elements (u);
//   qs part:   [rg][u][lane 0..31][16 bytes]; lane L = 4g + t holds 32-bit word t of unit u for rows g and g + 8:
//              Q4_0: {row g blk 2u, row g+8 blk 2u, row g blk 2u+1, row g+8 blk 2u+1} (word t of each block's qs)
//              Q4_K: {row g qs[32j+4t..], row g+8 qs[32j+4t..], row g qs[32j+16+4t..], row g+8 ...} (j = u % 4)
//   meta part: Q4_0: [rg][u][g 0..7][d(g,2u), d(g+8,2u), d(g,2u+1), d(g+8,2u+1)] (f16)
//              Q4_K: [rg][super-block][row 0..15][d, dmin, 12 bytes] where the 12 bytes re-pack the block's eight
//              6-bit scales and mins (same 96 bits) as four 24-bit fields, field j = sc[2j] | sc[2j+1] << 6 |
//              m[2j] << 12 | m[2j+1] << 18 at bit 24j, so a unit's four values come out with one funnel shift
//
// Activations are prepared once per vector batch (gemv_tiled_prepare_x) into the MMA B-fragment order and reused
// by every matrix that multiplies the same x (GDN qkv/gate/ba, attention q/k/v, expert gate/up).
//
// Arithmetic: quants become exact bf16 values (q - 8 for Q4_0, q for Q4_K) with one integer op per two elements;
// each f32 activation is split into three bf16 parts (hi + mid + lo = x to 24 bits) that occupy three MMA columns,
// so products are exact and sums are f32 (tensor-core accumulation); per 32-element block the MMA result is scaled
// by d (Q4_0) or d·sc and the min term dmin·m·Σx is subtracted (Q4_K). Agreement with ref::matvec_batch is ~1e-6
// of Σ|w·x| (the test states its bound). The summation order depends only on the shape: runs are bit-identical and
// y[v] does not depend on n_vec.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"

namespace kestrel::gpu {

// A re-tiled matrix on the device (q4_tile's output copied there). Not owned.
struct TiledQ4View {
  GgmlType type = GgmlType::kQ4_0;
  const void* data = nullptr;  // device, 16-byte aligned, q4_tiled_bytes(type, n_cols, n_rows) bytes
  int64_t n_cols = 0;          // ggml ne0 (n_in)
  int64_t n_rows = 0;          // ggml ne1 (n_out)
};

// True for Q4_0 with n_cols a multiple of 64, Q4_K with n_cols a multiple of 256, n_rows a positive multiple of 16
// and n_cols <= 8192 (a slice of prepared activations lives in shared memory).
bool q4_tiled_supports(GgmlType type, int64_t n_cols, int64_t n_rows);

// Bytes of the tiled form (equal to the raw GGUF bytes of the same matrix).
uint64_t q4_tiled_bytes(GgmlType type, int64_t n_cols, int64_t n_rows);

// Host-side re-tiling: raw = n_rows GGUF rows back to back; out.size() == q4_tiled_bytes(). kInvalidArgument when
// the shape is not supported or a size does not match. Pure function; thread-safe.
Status q4_tile(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out);

// Bytes of the prepared form of n_vec activation vectors of n_cols elements (n_cols a multiple of 64).
uint64_t tiled_x_bytes(int64_t n_cols, int n_vec);

// x: device f32 [n_vec, n_cols], 16-byte aligned; xprep: device, tiled_x_bytes() bytes, 16-byte aligned.
// Enqueues one small kernel. Thread-safe; returns without waiting.
Status gemv_tiled_prepare_x(const float* x, int64_t n_cols, int n_vec, void* xprep, cudaStream_t stream);

// y[v] = W x[v] with x given prepared (gemv_tiled_prepare_x with the same n_cols and n_vec, earlier on `stream`).
// y: device f32 [n_vec, n_rows], 4-byte aligned, not overlapping xprep; n_vec in [1, 32]. Errors are found before
// the launch and leave y untouched; otherwise one kernel is enqueued and the call returns without waiting.
// Thread-safe.
Status gemv_q4_tiled(const TiledQ4View& w, const void* xprep, int n_vec, float* y, cudaStream_t stream);

}  // namespace kestrel::gpu
