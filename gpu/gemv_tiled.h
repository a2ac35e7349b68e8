// gemv_tiled: GEMV v3 for Q4_0 and Q4_K weights re-tiled at load time (no widening: the same bytes, reordered) so
// that one 16-byte load per lane feeds bf16 tensor-core MMAs directly. docs/gpu.md ("GEMV v3") has the derivation.
//
// Layout (q4_tile writes it from raw GGUF rows; both parts together are exactly the raw size):
//   rows in groups of 16 ("row group" rg), columns in units of 64 elements (u);
//   qs part:   [rg][u][lane 0..31][16 bytes]; lane L = 4g + t holds 32-bit word t of unit u for rows g and g + 8:
//              Q4_0: {row g blk 2u, row g+8 blk 2u, row g blk 2u+1, row g+8 blk 2u+1} (word t of each block's qs)
//              Q4_K: {row g qs[32j+4t..], row g+8 qs[32j+4t..], row g qs[32j+16+4t..], row g+8 ...} (j = u % 4)
//   meta part: Q4_0: [rg][u][g 0..7][d(g,2u), d(g+8,2u), d(g,2u+1), d(g+8,2u+1)] (f16)
//              Q4_K: [rg][super-block][row 0..15][d, dmin, scales[12]] (the raw 16-byte head of each block)
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

// True for Q4_0 with n_cols a multiple of 64, Q4_K with n_cols a multiple of 256, n_rows a positive multiple of 16,
// and n_cols <= 12288 (the activations of one call live in shared memory).
bool q4_tiled_supports(GgmlType type, int64_t n_cols, int64_t n_rows);

// Bytes of the tiled form (equal to the raw GGUF bytes of the same matrix).
uint64_t q4_tiled_bytes(GgmlType type, int64_t n_cols, int64_t n_rows);

// Host-side re-tiling: raw = n_rows GGUF rows back to back; out.size() == q4_tiled_bytes(). kInvalidArgument when
// the shape is not supported or a size does not match. Pure function; thread-safe.
Status q4_tile(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out);

// y[v] = W x[v]. x: device f32 [n_vec, n_cols], 16-byte aligned; y: device f32 [n_vec, n_rows], 4-byte aligned, not
// overlapping x; n_vec in [1, 32]. Errors are found before the launch and leave y untouched; otherwise the kernel
// is enqueued on `stream` and the call returns without waiting. Thread-safe.
Status gemv_q4_tiled(const TiledQ4View& w, const float* x, int n_vec, float* y, cudaStream_t stream);

}  // namespace kestrel::gpu
