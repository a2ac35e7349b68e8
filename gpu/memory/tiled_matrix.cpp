// tile_matrix (see tiled_matrix.h): the host-side re-tiling of Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 rows for GEMV v4.
#include "gpu/memory/tiled_matrix.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant_internal.h"

namespace kestrel::gpu {
namespace {

constexpr int kTileRows = 16;
constexpr int kUnitElems = 64;
constexpr int64_t kMaxCols = 8192;
constexpr uint64_t kParallelBytes = uint64_t{4} << 20;  // output bytes per worker thread, at least

}  // namespace

bool tiled_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  if (n_rows <= 0 || n_rows % kTileRows != 0 || n_cols <= 0 || n_cols > kMaxCols) return false;
  if (n_rows / kTileRows > std::numeric_limits<int32_t>::max() / 16) return false;  // row groups × splits in int
  if (type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0) return n_cols % kUnitElems == 0;
  if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K) return n_cols % 256 == 0;
  return false;
}

uint64_t tiled_bytes(GgmlType type, int64_t n_cols, int64_t n_rows) {
  const uint64_t elems = static_cast<uint64_t>(n_cols) * static_cast<uint64_t>(n_rows);
  if (type == GgmlType::kQ4_K) return elems / 256 * sizeof(BlockQ4_K);
  if (type == GgmlType::kQ5_K) return elems / 256 * sizeof(BlockQ5_K);
  if (type == GgmlType::kQ6_K) return elems / 256 * sizeof(BlockQ6_K);
  if (type == GgmlType::kQ8_0) return elems / 32 * sizeof(BlockQ8_0);
  return elems / 32 * sizeof(BlockQ4_0);
}

namespace {

// Unit u of row group rg: lane 4g + t holds word t of the unit's two 16-byte quant runs (half 0, 1) of rows g and
// g + 8, in the order {g half 0, g + 8 half 0, g half 1, g + 8 half 1}; quants(row, u, half) points at a run.
template <class Quants>
void tile_quants(uint8_t* tile, int64_t rg, int64_t u, const Quants& quants) {
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4;
    const int t = lane % 4;
    const int64_t r0 = rg * kTileRows + g;
    std::memcpy(tile + lane * 16 + 0, quants(r0, u, 0) + 4 * t, 4);
    std::memcpy(tile + lane * 16 + 4, quants(r0 + 8, u, 0) + 4 * t, 4);
    std::memcpy(tile + lane * 16 + 8, quants(r0, u, 1) + 4 * t, 4);
    std::memcpy(tile + lane * 16 + 12, quants(r0 + 8, u, 1) + 4 * t, 4);
  }
}

// Row groups [rg0, rg1) of one matrix: raw GGUF rows at src, the tiled matrix's qs and meta parts (whole matrix).
// Q4_0 and Q8_0 (Block: BlockQ4_0 or BlockQ8_0): a unit is two blocks, each's d first; Q4_0's 16 quant bytes are
// one tile_quants run, Q8_0's 32 two (bytes 0-15 and 16-31 as a Q4_0 block's low and high nibbles).
template <class Block, GgmlType kType>
void tile_blocks32_rows(const uint8_t* src, int64_t n_cols, int64_t n_rg, int64_t rg0, int64_t rg1, uint8_t* out) {
  constexpr int64_t kQuantBytes = sizeof(Block) - 2;
  constexpr int64_t kUnitBytes = tiled_unit_quant_bytes(kType);  // 2 · 16 · kQuantBytes: 512 (Q4_0), 1024 (Q8_0)
  static_assert(kUnitBytes == 2 * 16 * kQuantBytes);
  const int64_t n_units = n_cols / kUnitElems;
  const int64_t row_bytes = n_cols / 32 * static_cast<int64_t>(sizeof(Block));
  uint8_t* qs = out;
  uint8_t* meta = out + tiled_meta_offset(kType, n_cols, n_rg * kTileRows);
  auto block = [&](int64_t row, int64_t b) { return src + row * row_bytes + b * static_cast<int64_t>(sizeof(Block)); };
  for (int64_t rg = rg0; rg < rg1; ++rg) {
    for (int64_t u = 0; u < n_units; ++u) {
      uint8_t* tile = qs + (rg * n_units + u) * kUnitBytes;
      if constexpr (kQuantBytes == 16) {
        tile_quants(tile, rg, u, [&](int64_t row, int64_t unit, int half) { return block(row, 2 * unit + half) + 2; });
      } else {
        for (int b = 0; b < 2; ++b) {
          tile_quants(tile + 512 * b, rg, u,
                      [&](int64_t row, int64_t unit, int half) { return block(row, 2 * unit + b) + 2 + 16 * half; });
        }
      }
      uint8_t* m = meta + (rg * n_units + u) * 64;
      for (int g = 0; g < 8; ++g) {
        const int64_t r0 = rg * kTileRows + g;
        std::memcpy(m + g * 8 + 0, block(r0, 2 * u), 2);
        std::memcpy(m + g * 8 + 2, block(r0 + 8, 2 * u), 2);
        std::memcpy(m + g * 8 + 4, block(r0, 2 * u + 1), 2);
        std::memcpy(m + g * 8 + 6, block(r0 + 8, 2 * u + 1), 2);
      }
    }
  }
}

// A K-quant super-block's 16-byte head in the tiled layout: d, dmin (the block's first 4 bytes), then the eight 6-bit
// scale / min pairs as four 24-bit fields, field j (bytes 3j .. 3j + 2 after d, dmin) = sc[2j] | sc[2j+1] << 6 |
// m[2j] << 12 | m[2j+1] << 18.
void pack_k_head(const uint8_t* block, const uint8_t* scales, uint8_t* m) {
  std::memcpy(m, block, 4);
  for (int j = 0; j < 4; ++j) {
    uint8_t sc0, mn0, sc1, mn1;
    quant_internal::k4_get_scale_min(2 * j, scales, &sc0, &mn0);
    quant_internal::k4_get_scale_min(2 * j + 1, scales, &sc1, &mn1);
    const uint32_t field = static_cast<uint32_t>(sc0) | (static_cast<uint32_t>(sc1) << 6) |
                           (static_cast<uint32_t>(mn0) << 12) | (static_cast<uint32_t>(mn1) << 18);
    m[4 + 3 * j] = static_cast<uint8_t>(field);
    m[4 + 3 * j + 1] = static_cast<uint8_t>(field >> 8);
    m[4 + 3 * j + 2] = static_cast<uint8_t>(field >> 16);
  }
}

void tile_q4_k_rows(const uint8_t* src, int64_t n_cols, int64_t n_rg, int64_t rg0, int64_t rg1, uint8_t* out) {
  const int64_t n_units = n_cols / kUnitElems;
  const int64_t n_sb = n_cols / 256;
  const int64_t row_bytes = n_sb * static_cast<int64_t>(sizeof(BlockQ4_K));
  uint8_t* qs = out;
  uint8_t* meta = out + tiled_meta_offset(GgmlType::kQ4_K, n_cols, n_rg * kTileRows);
  auto block = [&](int64_t row, int64_t sb) {
    return src + row * row_bytes + sb * static_cast<int64_t>(sizeof(BlockQ4_K));
  };
  constexpr size_t kQsOffset = offsetof(BlockQ4_K, qs);
  for (int64_t rg = rg0; rg < rg1; ++rg) {
    for (int64_t u = 0; u < n_units; ++u) {
      // A unit is 32 quant bytes (sub-blocks 2j, 2j + 1 in the nibbles) of super-block u / 4, j = u % 4.
      tile_quants(qs + (rg * n_units + u) * 512, rg, u, [&](int64_t row, int64_t unit, int half) {
        return block(row, unit / 4) + kQsOffset + 32 * (unit % 4) + 16 * half;
      });
    }
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      for (int row = 0; row < kTileRows; ++row) {
        const uint8_t* b = block(rg * kTileRows + row, sb);
        pack_k_head(b, b + offsetof(BlockQ4_K, scales), meta + (rg * n_sb + sb) * 256 + row * 16);
      }
    }
  }
}

// The layouts that keep each super-block's quants together (Q5_K, Q6_K): fn(block, qs, meta) once per super-block
// column sb of row groups [rg0, rg1), block(row) the raw block of the row group's row 0..15, qs and meta where that
// group's tiled quant and scale bytes go.
template <GgmlType kType, class Block, class Fn>
void each_super_block(const uint8_t* src, int64_t n_cols, int64_t n_rg, int64_t rg0, int64_t rg1, uint8_t* out,
                      Fn&& fn) {
  const int64_t n_sb = n_cols / 256;
  const int64_t row_bytes = n_sb * static_cast<int64_t>(sizeof(Block));
  constexpr int64_t kGroupQuant = 4 * tiled_unit_quant_bytes(kType), kGroupMeta = 4 * tiled_unit_meta_bytes(kType);
  uint8_t* meta = out + tiled_meta_offset(kType, n_cols, n_rg * kTileRows);
  for (int64_t rg = rg0; rg < rg1; ++rg) {
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      auto block = [&](int64_t row) {
        return src + (rg * kTileRows + row) * row_bytes + sb * static_cast<int64_t>(sizeof(Block));
      };
      fn(block, out + (rg * n_sb + sb) * kGroupQuant, meta + (rg * n_sb + sb) * kGroupMeta);
    }
  }
}

// Q5_K: per super-block its Q4_K-ordered low-nibble units, then one 32-bit high-bit word per unit and lane; meta as
// Q4_K's.
void tile_q5_k_rows(const uint8_t* src, int64_t n_cols, int64_t n_rg, int64_t rg0, int64_t rg1, uint8_t* out) {
  each_super_block<GgmlType::kQ5_K, BlockQ5_K>(
      src, n_cols, n_rg, rg0, rg1, out, [&](auto block, uint8_t* qs, uint8_t* meta) {
        for (int j = 0; j < 4; ++j) {  // tile_quants names rows from the matrix's first: row group 0 here
          tile_quants(qs + 512 * j, 0, j, [&](int64_t row, int64_t unit, int half) {
            return block(row) + offsetof(BlockQ5_K, qs) + 32 * unit + 16 * half;
          });
        }
        // Element 64j + 32h + i's fifth bit is bit 2j + h of qh[i] (i < 32); A register r's byte b of a lane holds
        // i = 16 (r / 2) + 4t + b of row g (r even) or g + 8.
        // Four bytes b at once: a word of qh bytes per A register, a word of the tile per unit.
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          uint32_t qh[4];  // A register r's qh bytes 16 (r / 2) + 4t .. + 3
          for (int r = 0; r < 4; ++r) {
            std::memcpy(&qh[r], block(r % 2 == 0 ? g : g + 8) + offsetof(BlockQ5_K, qh) + 16 * (r / 2) + 4 * t, 4);
          }
          for (int j = 0; j < 4; ++j) {
            uint32_t v = 0;
            for (int h = 0; h < 2; ++h) {
              for (int r = 0; r < 4; ++r) v |= ((qh[r] >> (2 * j + h)) & 0x01010101u) << (4 * h + r);
            }
            std::memcpy(qs + 2048 + lane * 16 + 4 * j, &v, 4);
          }
        }
        for (int row = 0; row < kTileRows; ++row) {
          const uint8_t* b = block(row);
          pack_k_head(b, b + offsetof(BlockQ5_K, scales), meta + row * 16);
        }
      });
}

void tile_q6_k_rows(const uint8_t* src, int64_t n_cols, int64_t n_rg, int64_t rg0, int64_t rg1, uint8_t* out) {
  each_super_block<GgmlType::kQ6_K, BlockQ6_K>(
      src, n_cols, n_rg, rg0, rg1, out, [&](auto block, uint8_t* qs, uint8_t* m) {
        uint8_t quants[kTileRows][256];
        for (int row = 0; row < kTileRows; ++row) quant_internal::q6_k_quants(block(row), quants[row]);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          // Four bytes b at once: the quants of elements e .. e + 3 are one word of the table.
          auto word = [](const uint8_t* q, int e) {
            uint32_t v;
            std::memcpy(&v, q + e, 4);
            return v;
          };
          for (int w = 0; w < 4; ++w) {
            const uint8_t* q = quants[w % 2 == 0 ? g : g + 8];
            for (int j = 0; j < 4; ++j) {  // low nibbles of unit j: sub-blocks s, s + 1 with s = 2 (w / 2)
              const int e = 64 * j + 16 * (2 * (w / 2)) + 4 * t;
              const uint32_t v = (word(q, e) & 0x0F0F0F0Fu) | ((word(q, e + 16) & 0x0F0F0F0Fu) << 4);
              std::memcpy(qs + 512 * j + lane * 16 + 4 * w, &v, 4);
            }
            for (int p = 0; p < 2; ++p) {  // high bits: word w of pair p belongs to unit 2p + w / 2
              const int unit = 2 * p + w / 2;
              uint32_t v = 0;
              for (int s = 0; s < 4; ++s) v |= ((word(q, 64 * unit + 16 * s + 4 * t) >> 4) & 0x03030303u) << (2 * s);
              std::memcpy(qs + 2048 + 512 * p + lane * 16 + 4 * w, &v, 4);
            }
          }
        }
        for (int g = 0; g < 8; ++g) {
          std::memcpy(m + 32 * g, block(g) + offsetof(BlockQ6_K, scales), 16);
          std::memcpy(m + 32 * g + 16, block(g + 8) + offsetof(BlockQ6_K, scales), 16);
          std::memcpy(m + 256 + 4 * g, block(g) + offsetof(BlockQ6_K, d), 2);
          std::memcpy(m + 256 + 4 * g + 2, block(g + 8) + offsetof(BlockQ6_K, d), 2);
        }
      });
}

}  // namespace

Status tile_matrix(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out) {
  return tile_matrix_stack(type, raw, n_cols, n_rows, 1, out, 1);
}

Status tile_matrix_stack(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, int64_t n_slices,
                         std::span<uint8_t> out, int max_threads) {
  if (!tiled_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "tile_matrix: " + std::string(ggml_type_name(type)) + " {" +
                                                       std::to_string(n_cols) + ", " + std::to_string(n_rows) +
                                                       "} cannot be tiled (q4_0 and q8_0 need n_cols % 64, the "
                                                       "k-quants n_cols % 256, n_rows % 16, n_cols <= 8192)");
  }
  const uint64_t slice_bytes = tiled_bytes(type, n_cols, n_rows);
  if (raw == nullptr || n_slices < 1 || max_threads < 0) {
    return make_error(ErrorCode::kInvalidArgument, "tile_matrix: null input, slice count " + std::to_string(n_slices) +
                                                       " below 1 or thread count " + std::to_string(max_threads) +
                                                       " below 0");
  }
  if (out.size() / slice_bytes != static_cast<uint64_t>(n_slices) || out.size() % slice_bytes != 0) {
    return make_error(ErrorCode::kInvalidArgument, "tile_matrix: output holds " + std::to_string(out.size()) +
                                                       " bytes, " + std::to_string(n_slices) + " tiled matrices need " +
                                                       std::to_string(slice_bytes) + " each");
  }
  const auto* src = static_cast<const uint8_t*>(raw);
  const int64_t n_rg = n_rows / kTileRows;
  const int64_t total = n_rg * n_slices;  // row groups of the whole stack
  // Item k = row group k % n_rg of slice k / n_rg; a worker takes a contiguous range of items.
  auto work = [&](int64_t k0, int64_t k1) {
    while (k0 < k1) {
      const int64_t slice = k0 / n_rg;
      const int64_t rg0 = k0 % n_rg;
      const int64_t rg1 = std::min(n_rg, rg0 + (k1 - k0));
      const uint8_t* s = src + static_cast<uint64_t>(slice) * slice_bytes;
      uint8_t* o = out.data() + static_cast<uint64_t>(slice) * slice_bytes;
      if (type == GgmlType::kQ4_0) {
        tile_blocks32_rows<BlockQ4_0, GgmlType::kQ4_0>(s, n_cols, n_rg, rg0, rg1, o);
      } else if (type == GgmlType::kQ8_0) {
        tile_blocks32_rows<BlockQ8_0, GgmlType::kQ8_0>(s, n_cols, n_rg, rg0, rg1, o);
      } else if (type == GgmlType::kQ4_K) {
        tile_q4_k_rows(s, n_cols, n_rg, rg0, rg1, o);
      } else if (type == GgmlType::kQ5_K) {
        tile_q5_k_rows(s, n_cols, n_rg, rg0, rg1, o);
      } else {
        tile_q6_k_rows(s, n_cols, n_rg, rg0, rg1, o);
      }
      k0 += rg1 - rg0;
    }
  };
  // Threads: at most max_threads (0: the hardware's), and one per kParallelBytes of output.
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t by_size = std::max<uint64_t>(1, out.size() / kParallelBytes);
  const int64_t n_threads = static_cast<int64_t>(std::min<uint64_t>(
      {max_threads == 0 ? hw : static_cast<unsigned>(max_threads), by_size, static_cast<uint64_t>(total)}));
  if (n_threads <= 1) {
    work(0, total);
    return ok_status();
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(n_threads - 1));
  for (int64_t i = 1; i < n_threads; ++i) pool.emplace_back(work, total * i / n_threads, total * (i + 1) / n_threads);
  work(0, total / n_threads);
  for (std::thread& th : pool) th.join();
  return ok_status();
}

}  // namespace kestrel::gpu
