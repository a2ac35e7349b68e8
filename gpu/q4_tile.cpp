// q4_tile (see q4_tile.h): the host-side re-tiling of Q4_0 / Q4_K rows for GEMV v4.
#include "gpu/q4_tile.h"

#include <cstddef>
#include <cstring>
#include <limits>
#include <string>

#include "core/quant/blocks.h"
#include "core/quant/quant_internal.h"

namespace kestrel::gpu {
namespace {

constexpr int kTileRows = 16;
constexpr int kUnitElems = 64;
constexpr int64_t kMaxCols = 8192;

}  // namespace

bool q4_tiled_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  if (n_rows <= 0 || n_rows % kTileRows != 0 || n_cols <= 0 || n_cols > kMaxCols) return false;
  if (n_rows / kTileRows > std::numeric_limits<int32_t>::max() / 16) return false;  // row groups × splits in int
  if (type == GgmlType::kQ4_0) return n_cols % kUnitElems == 0;
  if (type == GgmlType::kQ4_K) return n_cols % 256 == 0;
  return false;
}

uint64_t q4_tiled_bytes(GgmlType type, int64_t n_cols, int64_t n_rows) {
  const uint64_t elems = static_cast<uint64_t>(n_cols) * static_cast<uint64_t>(n_rows);
  return type == GgmlType::kQ4_K ? elems / 256 * sizeof(BlockQ4_K) : elems / 32 * sizeof(BlockQ4_0);
}

Status q4_tile(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out) {
  if (!q4_tiled_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "q4_tile: " + std::string(ggml_type_name(type)) + " {" +
                                                       std::to_string(n_cols) + ", " + std::to_string(n_rows) +
                                                       "} cannot be tiled (q4_0 needs n_cols % 64, q4_K n_cols % "
                                                       "256, n_rows % 16, n_cols <= 8192)");
  }
  if (out.size() != q4_tiled_bytes(type, n_cols, n_rows) || raw == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "q4_tile: output holds " + std::to_string(out.size()) +
                                                       " bytes, the tiled matrix needs " +
                                                       std::to_string(q4_tiled_bytes(type, n_cols, n_rows)));
  }
  const auto* src = static_cast<const uint8_t*>(raw);
  const int64_t n_units = n_cols / kUnitElems;
  const int64_t n_rg = n_rows / kTileRows;
  uint8_t* qs = out.data();
  uint8_t* meta = out.data() + n_rg * n_units * 512;
  if (type == GgmlType::kQ4_0) {
    const int64_t row_bytes = n_cols / 32 * static_cast<int64_t>(sizeof(BlockQ4_0));
    auto block = [&](int64_t row, int64_t b) { return src + row * row_bytes + b * sizeof(BlockQ4_0); };
    for (int64_t rg = 0; rg < n_rg; ++rg) {
      for (int64_t u = 0; u < n_units; ++u) {
        uint8_t* tile = qs + (rg * n_units + u) * 512;
        uint8_t* m = meta + (rg * n_units + u) * 64;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          const int64_t r0 = rg * kTileRows + g;
          const int64_t r8 = r0 + 8;
          // qs of a block start 2 bytes in (after d).
          std::memcpy(tile + lane * 16 + 0, block(r0, 2 * u) + 2 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 4, block(r8, 2 * u) + 2 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 8, block(r0, 2 * u + 1) + 2 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 12, block(r8, 2 * u + 1) + 2 + 4 * t, 4);
        }
        for (int g = 0; g < 8; ++g) {
          const int64_t r0 = rg * kTileRows + g;
          std::memcpy(m + g * 8 + 0, block(r0, 2 * u), 2);
          std::memcpy(m + g * 8 + 2, block(r0 + 8, 2 * u), 2);
          std::memcpy(m + g * 8 + 4, block(r0, 2 * u + 1), 2);
          std::memcpy(m + g * 8 + 6, block(r0 + 8, 2 * u + 1), 2);
        }
      }
    }
  } else {
    const int64_t n_sb = n_cols / 256;
    const int64_t row_bytes = n_sb * static_cast<int64_t>(sizeof(BlockQ4_K));
    auto block = [&](int64_t row, int64_t sb) { return src + row * row_bytes + sb * sizeof(BlockQ4_K); };
    constexpr size_t kQsOffset = offsetof(BlockQ4_K, qs);
    for (int64_t rg = 0; rg < n_rg; ++rg) {
      for (int64_t u = 0; u < n_units; ++u) {
        const int64_t sb = u / 4;
        const int64_t j = u % 4;
        uint8_t* tile = qs + (rg * n_units + u) * 512;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          const int64_t r0 = rg * kTileRows + g;
          const int64_t r8 = r0 + 8;
          std::memcpy(tile + lane * 16 + 0, block(r0, sb) + kQsOffset + 32 * j + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 4, block(r8, sb) + kQsOffset + 32 * j + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 8, block(r0, sb) + kQsOffset + 32 * j + 16 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 12, block(r8, sb) + kQsOffset + 32 * j + 16 + 4 * t, 4);
        }
      }
      for (int64_t sb = 0; sb < n_sb; ++sb) {
        for (int row = 0; row < kTileRows; ++row) {
          const uint8_t* b = block(rg * kTileRows + row, sb);
          uint8_t* m = meta + (rg * n_sb + sb) * 256 + row * 16;
          std::memcpy(m, b, 4);  // d, dmin
          uint8_t sc[8];
          uint8_t mn[8];
          for (int k = 0; k < 8; ++k)
            quant_internal::k4_get_scale_min(k, b + offsetof(BlockQ4_K, scales), &sc[k], &mn[k]);
          uint8_t packed[12] = {};
          for (int j = 0; j < 4; ++j) {
            const uint32_t field = static_cast<uint32_t>(sc[2 * j]) | (static_cast<uint32_t>(sc[2 * j + 1]) << 6) |
                                   (static_cast<uint32_t>(mn[2 * j]) << 12) |
                                   (static_cast<uint32_t>(mn[2 * j + 1]) << 18);
            for (int bit = 0; bit < 24; ++bit) {
              if ((field >> bit) & 1u) {
                const int at = 24 * j + bit;
                packed[at / 8] = static_cast<uint8_t>(packed[at / 8] | (1u << (at % 8)));
              }
            }
          }
          std::memcpy(m + 4, packed, 12);
        }
      }
    }
  }
  return ok_status();
}

}  // namespace kestrel::gpu
