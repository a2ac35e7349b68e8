// The tiled layout (tiled_matrix.h) written piece by piece, for the host tiler (tiled_matrix.cpp) and the device one
// (gpu/kernels/tile_device.h) alike: one definition of the layout, compiled for both sides.
//
// A matrix's row group rg (16 rows) splits into pieces that do not depend on each other:
//   quant pieces: 16 bytes of the qs part each, in output order — qs_pieces(type, n_cols) of them per row group, piece
//                 p at qs + (rg · qs_pieces + p) · 16, so consecutive pieces are consecutive bytes (a warp of device
//                 threads writes 512 contiguous bytes);
//   meta items:   meta_items(type, n_cols) per row group, each a unit's or super-block's scales for some rows.
// write_qs_piece / write_meta_item read the row group's raw GGUF rows (src: the whole matrix, row-major, any alignment)
// and write their bytes of the tiled matrix (out: the whole matrix). Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/gguf/ggml_type.h"
#include "core/quant/blocks.h"
#include "gpu/memory/tiled_matrix.h"

#define KESTREL_TILE_FN KESTREL_TILED_HD inline

namespace kestrel::gpu::tile_pieces {

inline constexpr int kTileRows = 16;
inline constexpr int kUnitElems = 64;

KESTREL_TILE_FN uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
KESTREL_TILE_FN void store_u32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }

KESTREL_TILE_FN uint64_t block_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return sizeof(BlockQ8_0);
    case GgmlType::kQ4_K: return sizeof(BlockQ4_K);
    case GgmlType::kQ5_K: return sizeof(BlockQ5_K);
    case GgmlType::kQ6_K: return sizeof(BlockQ6_K);
    default: return sizeof(BlockQ4_0);
  }
}
// Bytes of one raw GGUF row of n_cols elements.
KESTREL_TILE_FN int64_t row_bytes_of(GgmlType type, int64_t n_cols) {
  const bool k_quant = type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
  return n_cols / (k_quant ? 256 : 32) * static_cast<int64_t>(block_bytes(type));
}

// Calls fn(std::integral_constant<GgmlType, T>{}) for the tiled format T == type (one of those tiled_supports takes),
// so a caller's loop over pieces compiles to one format's code: the one dispatch from a run-time type (host code).
template <class Fn>
inline void with_tiled_type(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::kQ4_0: fn(std::integral_constant<GgmlType, GgmlType::kQ4_0>{}); return;
    case GgmlType::kQ8_0: fn(std::integral_constant<GgmlType, GgmlType::kQ8_0>{}); return;
    case GgmlType::kQ4_K: fn(std::integral_constant<GgmlType, GgmlType::kQ4_K>{}); return;
    case GgmlType::kQ5_K: fn(std::integral_constant<GgmlType, GgmlType::kQ5_K>{}); return;
    default: fn(std::integral_constant<GgmlType, GgmlType::kQ6_K>{}); return;
  }
}

// Quant pieces (16 bytes) and meta items of one row group.
KESTREL_TILE_FN int64_t qs_pieces(GgmlType type, int64_t n_cols) {
  return n_cols / kUnitElems * tiled_unit_quant_bytes(type) / 16;
}
KESTREL_TILE_FN int64_t meta_items(GgmlType type, int64_t n_cols) {
  if (type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0) return n_cols / kUnitElems * 8;  // (unit, g)
  if (type == GgmlType::kQ6_K) return n_cols / 256 * 8;                                    // (super-block, g)
  return n_cols / 256 * kTileRows;                                                         // (super-block, row)
}

// The 16 bytes lane L = 4g + t holds: word t of the 16-byte quant runs a(row), b(row) of rows g and g + 8, in the order
// {g a, g + 8 a, g b, g + 8 b} (tiled_matrix.h, "qs part").
KESTREL_TILE_FN void lane_words(uint8_t* dst, const uint8_t* a0, const uint8_t* a1, const uint8_t* b0,
                                const uint8_t* b1, int t) {
  store_u32(dst + 0, load_u32(a0 + 4 * t));
  store_u32(dst + 4, load_u32(a1 + 4 * t));
  store_u32(dst + 8, load_u32(b0 + 4 * t));
  store_u32(dst + 12, load_u32(b1 + 4 * t));
}

// Of four consecutive elements e .. e + 3 (e % 4 == 0) of a Q6_K block (ggml's layout, core/quant/q6_k.cpp), one word
// each, byte i for element e + i: the quants' low four bits, and their top two bits.
KESTREL_TILE_FN uint32_t q6_low4(const uint8_t* blk, int e) {
  const int half = e / 128, k = (e % 128) / 32, l = e % 32;
  return (load_u32(blk + offsetof(BlockQ6_K, ql) + 64 * half + 32 * (k % 2) + l) >> (k / 2 * 4)) & 0x0F0F0F0Fu;
}
KESTREL_TILE_FN uint32_t q6_high2(const uint8_t* blk, int e) {
  const int half = e / 128, k = (e % 128) / 32, l = e % 32;
  return (load_u32(blk + offsetof(BlockQ6_K, qh) + 32 * half + l) >> (2 * k)) & 0x03030303u;
}

// Sub-block j's 6-bit scale and min from a K-quant's 12 packed bytes (ggml's get_scale_min_k4).
KESTREL_TILE_FN void k4_scale_min(int j, const uint8_t* packed, uint32_t* scale, uint32_t* min) {
  if (j < 4) {
    *scale = packed[j] & 0x3Fu;
    *min = packed[j + 4] & 0x3Fu;
  } else {
    *scale = (packed[j + 4] & 0x0Fu) | ((uint32_t{packed[j - 4]} >> 6) << 4);
    *min = (uint32_t{packed[j + 4]} >> 4) | ((uint32_t{packed[j]} >> 6) << 4);
  }
}

// A K-quant super-block's 16-byte head in the tiled layout: d, dmin, then four 24-bit fields, field j = sc[2j] |
// sc[2j+1] << 6 | m[2j] << 12 | m[2j+1] << 18.
KESTREL_TILE_FN void pack_k_head(const uint8_t* block, uint8_t* m) {
  const uint8_t* scales = block + offsetof(BlockQ4_K, scales);  // at the same offset in Q5_K
  memcpy(m, block, 4);
  for (int j = 0; j < 4; ++j) {
    uint32_t sc0, mn0, sc1, mn1;
    k4_scale_min(2 * j, scales, &sc0, &mn0);
    k4_scale_min(2 * j + 1, scales, &sc1, &mn1);
    const uint32_t field = sc0 | (sc1 << 6) | (mn0 << 12) | (mn1 << 18);
    m[4 + 3 * j] = static_cast<uint8_t>(field);
    m[4 + 3 * j + 1] = static_cast<uint8_t>(field >> 8);
    m[4 + 3 * j + 2] = static_cast<uint8_t>(field >> 16);
  }
}

// Quant piece p of row group rg. type, n_cols as tiled_supports takes them; n_rows the matrix's. The type is a
// template argument, so the callers' loops compile to one format's code.
template <GgmlType type>
KESTREL_TILE_FN void write_qs_piece(const uint8_t* src, int64_t n_cols, int64_t rg, int64_t p, uint8_t* out) {
  const uint64_t bb = block_bytes(type);
  const int64_t row_bytes = row_bytes_of(type, n_cols);
  uint8_t* dst = out + (rg * qs_pieces(type, n_cols) + p) * 16;
  const int lane = static_cast<int>(p % 32);
  const int g = lane / 4, t = lane % 4;
  const uint8_t* r0 = src + (rg * kTileRows + g) * row_bytes;  // rows g and g + 8 of the group
  const uint8_t* r1 = r0 + 8 * row_bytes;
  switch (type) {
    case GgmlType::kQ4_0: {  // unit u = blocks 2u, 2u + 1: their 16 quant bytes each
      const int64_t u = p / 32;
      const int64_t a = 2 * u * static_cast<int64_t>(bb) + 2, b = a + static_cast<int64_t>(bb);
      lane_words(dst, r0 + a, r1 + a, r0 + b, r1 + b, t);
      return;
    }
    case GgmlType::kQ8_0: {  // unit u, half h = block 2u + h: its 32 quant bytes as two runs
      const int64_t u = p / 64, h = (p / 32) % 2;
      const int64_t a = (2 * u + h) * static_cast<int64_t>(bb) + 2, b = a + 16;
      lane_words(dst, r0 + a, r1 + a, r0 + b, r1 + b, t);
      return;
    }
    case GgmlType::kQ4_K: {  // unit u = 32 quant bytes of super-block u / 4 from byte 32 (u % 4)
      const int64_t u = p / 32;
      const int64_t a = u / 4 * static_cast<int64_t>(bb) + offsetof(BlockQ4_K, qs) + 32 * (u % 4), b = a + 16;
      lane_words(dst, r0 + a, r1 + a, r0 + b, r1 + b, t);
      return;
    }
    case GgmlType::kQ5_K: {  // per super-block: four Q4_K-ordered units of low nibbles, then a high-bit piece per lane
      const int64_t sb = p / 160, q = p % 160;
      const uint8_t* b0 = r0 + sb * static_cast<int64_t>(bb);
      const uint8_t* b1 = r1 + sb * static_cast<int64_t>(bb);
      if (q < 128) {
        const int64_t a = offsetof(BlockQ5_K, qs) + 32 * (q / 32), b = a + 16;
        lane_words(dst, b0 + a, b1 + a, b0 + b, b1 + b, t);
        return;
      }
      // Element 64j + 32h + i's fifth bit is bit 2j + h of qh[i]; A register r's byte b of a lane holds
      // i = 16 (r / 2) + 4t + b of row g (r even) or g + 8. Word j of the piece is unit j's.
      uint32_t qh[4];
      for (int r = 0; r < 4; ++r)
        qh[r] = load_u32((r % 2 == 0 ? b0 : b1) + offsetof(BlockQ5_K, qh) + 16 * (r / 2) + 4 * t);
      for (int j = 0; j < 4; ++j) {
        uint32_t v = 0;
        for (int h = 0; h < 2; ++h) {
          for (int r = 0; r < 4; ++r) v |= ((qh[r] >> (2 * j + h)) & 0x01010101u) << (4 * h + r);
        }
        store_u32(dst + 4 * j, v);
      }
      return;
    }
    default: {  // Q6_K: per super-block the low nibbles of units 0..3, then the high bits of unit pairs 0, 1
      const int64_t sb = p / 192, q = p % 192;
      const uint8_t* b0 = r0 + sb * static_cast<int64_t>(bb);
      const uint8_t* b1 = r1 + sb * static_cast<int64_t>(bb);
      for (int w = 0; w < 4; ++w) {
        const uint8_t* blk = w % 2 == 0 ? b0 : b1;
        uint32_t v = 0;
        if (q < 128) {  // unit j's low nibbles: sub-blocks s, s + 1 with s = 2 (w / 2)
          const int e = 64 * static_cast<int>(q / 32) + 16 * (2 * (w / 2)) + 4 * t;
          v = q6_low4(blk, e) | (q6_low4(blk, e + 16) << 4);
        } else {  // high bits: word w of pair pr belongs to unit 2 pr + w / 2
          const int unit = 2 * static_cast<int>((q - 128) / 32) + w / 2;
          for (int s = 0; s < 4; ++s) v |= q6_high2(blk, 64 * unit + 16 * s + 4 * t) << (2 * s);
        }
        store_u32(dst + 4 * w, v);
      }
      return;
    }
  }
}

// Meta item i of row group rg; n_rg the matrix's row groups (the meta part follows all of its quants).
template <GgmlType type>
KESTREL_TILE_FN void write_meta_item(const uint8_t* src, int64_t n_cols, int64_t n_rg, int64_t rg, int64_t i,
                                     uint8_t* out) {
  const uint64_t bb = block_bytes(type);
  const int64_t row_bytes = row_bytes_of(type, n_cols);
  uint8_t* meta = out + tiled_meta_offset(type, n_cols, n_rg * kTileRows);
  const int64_t rows0 = rg * kTileRows;
  if (type == GgmlType::kQ4_0 ||
      type == GgmlType::kQ8_0) {  // unit u, g: d(g, 2u), d(g+8, 2u), d(g, 2u+1), d(g+8, 2u+1)
    const int64_t u = i / 8, g = i % 8;
    const uint8_t* r0 = src + (rows0 + g) * row_bytes + 2 * u * static_cast<int64_t>(bb);
    const uint8_t* r1 = r0 + 8 * row_bytes;
    uint8_t* m = meta + (rg * (n_cols / kUnitElems) + u) * 64 + g * 8;
    memcpy(m + 0, r0, 2);
    memcpy(m + 2, r1, 2);
    memcpy(m + 4, r0 + bb, 2);
    memcpy(m + 6, r1 + bb, 2);
    return;
  }
  const int64_t n_sb = n_cols / 256;
  if (type == GgmlType::kQ6_K) {  // super-block sb, g: rows g and g + 8's scales, then their d
    const int64_t sb = i / 8, g = i % 8;
    const uint8_t* b0 = src + (rows0 + g) * row_bytes + sb * static_cast<int64_t>(bb);
    const uint8_t* b1 = b0 + 8 * row_bytes;
    uint8_t* m = meta + (rg * n_sb + sb) * 288;
    memcpy(m + 32 * g, b0 + offsetof(BlockQ6_K, scales), 16);
    memcpy(m + 32 * g + 16, b1 + offsetof(BlockQ6_K, scales), 16);
    memcpy(m + 256 + 4 * g, b0 + offsetof(BlockQ6_K, d), 2);
    memcpy(m + 256 + 4 * g + 2, b1 + offsetof(BlockQ6_K, d), 2);
    return;
  }
  const int64_t sb = i / kTileRows, row = i % kTileRows;  // Q4_K / Q5_K: super-block sb of one row
  pack_k_head(src + (rows0 + row) * row_bytes + sb * static_cast<int64_t>(bb),
              meta + (rg * n_sb + sb) * 256 + row * 16);
}

}  // namespace kestrel::gpu::tile_pieces
