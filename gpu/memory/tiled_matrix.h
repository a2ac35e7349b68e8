// tile_matrix: the re-tiled form of Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 matrices that GEMV v4 (gpu/kernels/gemv_imma.h)
// reads — the same bytes as the GGUF rows, reordered (never widened) so that one 16-byte load per lane is the A
// fragment of two integer MMAs (Q6_K: the low nibbles of four m16n8k16 MMAs, their high bits in a second load shared by
// two units; Q8_0: one). The WeightPool tiles tensors into it at registration (PoolLayout::kTiled); docs/gpu.md ("GEMV
// v4") has more.
//
// Layout (tile_matrix writes it from raw GGUF rows; both parts together are exactly the raw size):
//   rows in groups of 16 ("row group" rg), columns in units of 64 elements (u);
//   qs part:   [rg][u][lane 0..31][16 bytes]; lane L = 4g + t holds 32-bit word t of unit u for rows g and g + 8:
//              Q4_0: {row g blk 2u, row g+8 blk 2u, row g blk 2u+1, row g+8 blk 2u+1} (word t of each block's qs)
//              Q4_K: {row g qs[32j+4t..], row g+8 qs[32j+4t..], row g qs[32j+16+4t..], row g+8 ...} (j = u % 4)
//   meta part: Q4_0: [rg][u][g 0..7][d(g,2u), d(g+8,2u), d(g,2u+1), d(g+8,2u+1)] (f16)
//              Q4_K: [rg][super-block][row 0..15][d, dmin, 12 bytes] where the 12 bytes re-pack the block's eight
//              6-bit scales and mins (same 96 bits) as four 24-bit fields, field j = sc[2j] | sc[2j+1] << 6 |
//              m[2j] << 12 | m[2j+1] << 18 at bit 24j, so a unit's four values come out with one funnel shift
//   Q5_K: qs part [rg][super-block][2560 bytes]: the four units' low nibbles as Q4_K's (512 bytes each), then
//              [lane][16 bytes] of high bits, word j for unit j: bit 4h + r of byte b is the fifth bit of byte b of
//              A register r's word (r = 0..3 in the Q4_K unit word's order) in sub-block 2j + h; meta part as Q4_K's
//   Q8_0 (units of two blocks, 1024 bytes): qs part [rg][u][blk 2u, 2u + 1][lane][16 bytes], lane 4g + t holding
//              {row g qs[4t..], row g+8 qs[4t..], row g qs[16+4t..], row g+8 qs[16+4t..]} of the block;
//              meta part as Q4_0's
//   Q6_K (its own order; q(e) is element e's 6-bit quant of its row's super-block sb, sub-block s = e / 16):
//   qs part:   [rg][sb][3072 bytes]: the low nibbles of unit j (elements 64j ..) at 512j, [lane][16 bytes], words
//              {row g, row g+8, row g, row g+8}; byte b of word w: q(64j + 16s + 4t + b) & 15 with s = 2(w / 2) in
//              the low nibble, s + 1 in the high nibble; then the high bits of units 2p, 2p + 1 at 2048 + 512p,
//              [lane][16 bytes], words {row g unit 2p, row g+8 unit 2p, row g unit 2p+1, row g+8 unit 2p+1}, byte b
//              of a word holding q(64j + 16s + 4t + b) >> 4 at bits 2s, 2s + 1 for s = 0..3
//   meta part: Q6_K: [rg][sb][288 bytes]: [g 0..7][row g's 16 int8 scales, row g+8's] (256 bytes), then
//              [g 0..7][d(g), d(g+8)] (f16)
//
#pragma once

#include <cstdint>
#include <span>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"

// Functions of the layout that device code calls too (gpu/kernels/tile_device.h, gpu/memory/tile_pieces.h).
#if defined(__CUDACC__)
#define KESTREL_TILED_HD __host__ __device__
#else
#define KESTREL_TILED_HD
#endif

namespace kestrel::gpu {

// A re-tiled matrix on the device (tile_matrix's output copied there). Not owned.
struct TiledView {
  GgmlType type = GgmlType::kQ4_0;
  const void* data = nullptr;  // device, 16-byte aligned, tiled_bytes(type, n_cols, n_rows) bytes
  int64_t n_cols = 0;          // ggml ne0 (n_in)
  int64_t n_rows = 0;          // ggml ne1 (n_out)
};

// The layout's sizes, one place for the host tiler and the device kernels (gpu/kernels/imma_tile.cuh): quant bytes per
// 64-column unit of a row group (a K-quant's four units share its super-block's group: the group's bytes / 4) and scale
// bytes likewise; all quants of a matrix come first, its scales from tiled_meta_offset() on.
KESTREL_TILED_HD constexpr int tiled_unit_quant_bytes(GgmlType type) {
  return type == GgmlType::kQ5_K ? 640 : type == GgmlType::kQ6_K ? 768 : type == GgmlType::kQ8_0 ? 1024 : 512;
}
KESTREL_TILED_HD constexpr int tiled_unit_meta_bytes(GgmlType type) { return type == GgmlType::kQ6_K ? 72 : 64; }
KESTREL_TILED_HD constexpr uint64_t tiled_meta_offset(GgmlType type, int64_t n_cols, int64_t n_rows) {
  return static_cast<uint64_t>(n_rows / 16) * static_cast<uint64_t>(n_cols / 64) *
         static_cast<uint64_t>(tiled_unit_quant_bytes(type));
}

// True for Q4_0 and Q8_0 with n_cols a multiple of 64, Q4_K, Q5_K and Q6_K with n_cols a multiple of 256, n_rows a
// positive multiple of 16 and n_cols <= 8192 (the longest row GEMV v4 takes).
bool tiled_supports(GgmlType type, int64_t n_cols, int64_t n_rows);

// Bytes of the tiled form (equal to the raw GGUF bytes of the same matrix).
uint64_t tiled_bytes(GgmlType type, int64_t n_cols, int64_t n_rows);

// Host-side re-tiling: raw = n_rows GGUF rows back to back; out.size() == tiled_bytes(). kInvalidArgument when
// the shape is not supported or a size does not match. Pure function; thread-safe; one thread.
Status tile_matrix(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out);

// A stack of n_slices such matrices (a 3-D tensor, e.g. an MoE expert stack), each tiled on its own into consecutive
// tiled_bytes() slices of out; the same bytes as n_slices tile_matrix calls. Row groups are shared out over up to
// max_threads threads (0: the hardware's; at least 4 MiB of output per thread), joined before it returns.
Status tile_matrix_stack(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, int64_t n_slices,
                         std::span<uint8_t> out, int max_threads = 0);

}  // namespace kestrel::gpu
