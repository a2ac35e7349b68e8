// gpu/tiled_matrix: the re-tiled Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 layout GEMV v4 reads (host code, no device needed).
// The tiled bytes are decoded back into GGUF blocks by following the layout tiled_matrix.h documents, independently of
// tile_matrix's own loops, and must give back the raw matrix byte for byte; a stack tiled on any number of threads
// equals its slices tiled one by one; shapes and arguments it does not take are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/quant/quant_internal.h"
#include "gpu/memory/tiled_matrix.h"
#include "tests/gpu/block_test_util.h"

namespace kestrel::gpu {
namespace {

// Random blocks of an n_rows × n_cols matrix.
std::vector<uint8_t> random_matrix(GgmlType t, int64_t n_cols, int64_t n_rows, std::mt19937& rng) {
  return test::random_blocks(t, tiled_bytes(t, n_cols, n_rows), rng);
}

// Sets element e's 6-bit quant v in a Q6_K block, following ggml's layout (core/quant/q6_k.cpp's head).
void put_q6(uint8_t* blk, int e, uint32_t v) {
  const int half = e / 128, k = (e % 128) / 32, l = e % 32;
  uint8_t& ql = blk[offsetof(BlockQ6_K, ql) + 64 * half + 32 * (k % 2) + l];
  uint8_t& qh = blk[offsetof(BlockQ6_K, qh) + 32 * half + l];
  const int nib = k / 2 * 4;
  ql = static_cast<uint8_t>((ql & ~(15 << nib)) | ((v & 15) << nib));
  qh = static_cast<uint8_t>((qh & ~(3 << (2 * k))) | (((v >> 4) & 3) << (2 * k)));
}

// Q6_K rows back from a tiled matrix (tiled_matrix.h's Q6_K layout).
std::vector<uint8_t> untile_q6_k(const std::vector<uint8_t>& tiled, int64_t n_cols, int64_t n_rows) {
  std::vector<uint8_t> raw(tiled.size(), 0);
  const int64_t n_sb = n_cols / 256, n_rg = n_rows / 16;
  const uint8_t* meta = tiled.data() + n_rg * n_sb * 3072;
  for (int64_t rg = 0; rg < n_rg; ++rg) {
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      auto block = [&](int row) { return raw.data() + ((rg * 16 + row) * n_sb + sb) * 210; };
      const uint8_t* q = tiled.data() + (rg * n_sb + sb) * 3072;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, tw = lane % 4;
        for (int j = 0; j < 4; ++j) {      // unit
          for (int s = 0; s < 4; ++s) {    // sub-block of the unit
            for (int r = 0; r < 2; ++r) {  // row g, g + 8
              const uint8_t* lo = q + 512 * j + lane * 16 + 4 * (2 * (s / 2) + r);
              const uint8_t* hi = q + 2048 + 512 * (j / 2) + lane * 16 + 4 * (2 * (j % 2) + r);
              for (int b = 0; b < 4; ++b) {
                const uint32_t v = ((lo[b] >> (4 * (s % 2))) & 15) | (((hi[b] >> (2 * s)) & 3) << 4);
                put_q6(block(g + 8 * r), 64 * j + 16 * s + 4 * tw + b, v);
              }
            }
          }
        }
      }
      const uint8_t* m = meta + (rg * n_sb + sb) * 288;
      for (int g = 0; g < 8; ++g) {
        std::memcpy(block(g) + offsetof(BlockQ6_K, scales), m + 32 * g, 16);
        std::memcpy(block(g + 8) + offsetof(BlockQ6_K, scales), m + 32 * g + 16, 16);
        std::memcpy(block(g) + offsetof(BlockQ6_K, d), m + 256 + 4 * g, 2);
        std::memcpy(block(g + 8) + offsetof(BlockQ6_K, d), m + 256 + 4 * g + 2, 2);
      }
    }
  }
  return raw;
}

// A K-quant super-block's head back from its tiled 16 bytes: d, dmin to the block's start, the four 24-bit fields
// (field k / 2 at bit 24·(k / 2): sc at 6·(k % 2), m at 12 + 6·(k % 2)) to its packed 6-bit scales.
void unpack_k_head(const uint8_t* head, uint8_t* block, uint8_t* scales) {
  std::memcpy(block, head, 4);
  std::memset(scales, 0, 12);
  for (int k = 0; k < 8; ++k) {
    uint32_t field = 0;
    std::memcpy(&field, head + 4 + 3 * (k / 2), 3);
    const auto sc = static_cast<uint8_t>((field >> (6 * (k % 2))) & 63u);
    const auto mn = static_cast<uint8_t>((field >> (12 + 6 * (k % 2))) & 63u);
    quant_internal::k4_put_scale_min(k, sc, mn, scales);
  }
}

// Q5_K rows back from a tiled matrix (tiled_matrix.h's Q5_K layout).
std::vector<uint8_t> untile_q5_k(const std::vector<uint8_t>& tiled, int64_t n_cols, int64_t n_rows) {
  std::vector<uint8_t> raw(tiled.size(), 0);
  const int64_t n_sb = n_cols / 256, n_rg = n_rows / 16;
  const uint8_t* meta = tiled.data() + n_rg * n_sb * 2560;
  for (int64_t rg = 0; rg < n_rg; ++rg) {
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      auto block = [&](int64_t row) { return raw.data() + (row * n_sb + sb) * 176; };
      const uint8_t* q = tiled.data() + (rg * n_sb + sb) * 2560;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, tw = lane % 4;
        for (int j = 0; j < 4; ++j) {
          const uint8_t* word = q + 512 * j + lane * 16;
          const uint8_t* high = q + 2048 + lane * 16 + 4 * j;
          for (int r = 0; r < 4; ++r) {  // word r: rows g, g + 8, g, g + 8; elements 4t.. then 16 + 4t..
            uint8_t* blk = block(rg * 16 + (r % 2 == 0 ? g : g + 8));
            std::memcpy(blk + offsetof(BlockQ5_K, qs) + 32 * j + 16 * (r / 2) + 4 * tw, word + 4 * r, 4);
            for (int b = 0; b < 4; ++b) {
              for (int h = 0; h < 2; ++h) {  // the low (h = 0) or high nibble's element: sub-block 2j + h
                const int e = 64 * j + 32 * h + 16 * (r / 2) + 4 * tw + b;
                blk[offsetof(BlockQ5_K, qh) + e % 32] |=
                    static_cast<uint8_t>(((high[b] >> (4 * h + r)) & 1) << (e / 32));
              }
            }
          }
        }
      }
      for (int row = 0; row < 16; ++row) {
        uint8_t* b = block(rg * 16 + row);
        unpack_k_head(meta + ((rg * n_sb + sb) * 16 + row) * 16, b, b + offsetof(BlockQ5_K, scales));
      }
    }
  }
  return raw;
}

// The raw rows back from a tiled matrix, per the layout in tiled_matrix.h.
std::vector<uint8_t> untile(GgmlType t, const std::vector<uint8_t>& tiled, int64_t n_cols, int64_t n_rows) {
  if (t == GgmlType::kQ6_K) return untile_q6_k(tiled, n_cols, n_rows);
  if (t == GgmlType::kQ5_K) return untile_q5_k(tiled, n_cols, n_rows);
  std::vector<uint8_t> raw(tiled.size());
  const int64_t n_units = n_cols / 64;
  const int64_t n_rg = n_rows / 16;
  const uint8_t* qs = tiled.data();
  const uint8_t* meta = tiled.data() + n_rg * n_units * 512;  // Q4_K; Q4_0 and Q8_0 set their own
  if (t == GgmlType::kQ4_0 || t == GgmlType::kQ8_0) {
    // A unit is two blocks: Q4_0 one 512-byte run of words {g blk 2u, g+8 blk 2u, g blk 2u+1, g+8 blk 2u+1} (bytes
    // 4t.. of each block's 16 quant bytes), Q8_0 one run per block b, {g, g+8, g, g+8} at quant bytes 4t.., 16+4t...
    const bool q8 = t == GgmlType::kQ8_0;
    const int64_t block_bytes = q8 ? 34 : 18;
    const int64_t unit_bytes = q8 ? 1024 : 512;
    const int64_t row_bytes = n_cols / 32 * block_bytes;
    meta = tiled.data() + n_rg * n_units * unit_bytes;
    auto block = [&](int64_t row, int64_t b) { return raw.data() + row * row_bytes + b * block_bytes; };
    for (int64_t rg = 0; rg < n_rg; ++rg) {
      for (int64_t u = 0; u < n_units; ++u) {
        for (int run = 0; run < (q8 ? 2 : 1); ++run) {
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, tw = lane % 4;
            const uint8_t* word = qs + (rg * n_units + u) * unit_bytes + 512 * run + lane * 16;
            for (int w = 0; w < 4; ++w) {
              const int64_t row = rg * 16 + g + 8 * (w % 2);
              const int64_t blk = q8 ? 2 * u + run : 2 * u + w / 2;
              const int64_t off = q8 ? 16 * (w / 2) : 0;
              std::memcpy(block(row, blk) + 2 + off + 4 * tw, word + 4 * w, 4);
            }
          }
        }
        for (int g = 0; g < 8; ++g) {
          const uint8_t* d = meta + ((rg * n_units + u) * 8 + g) * 8;
          const int64_t r0 = rg * 16 + g;
          std::memcpy(block(r0, 2 * u), d + 0, 2);
          std::memcpy(block(r0 + 8, 2 * u), d + 2, 2);
          std::memcpy(block(r0, 2 * u + 1), d + 4, 2);
          std::memcpy(block(r0 + 8, 2 * u + 1), d + 6, 2);
        }
      }
    }
    return raw;
  }
  const int64_t n_sb = n_cols / 256;
  const int64_t row_bytes = n_sb * static_cast<int64_t>(sizeof(BlockQ4_K));
  auto block = [&](int64_t row, int64_t sb) { return raw.data() + row * row_bytes + sb * 144; };
  for (int64_t rg = 0; rg < n_rg; ++rg) {
    for (int64_t u = 0; u < n_units; ++u) {
      const int64_t sb = u / 4, j = u % 4;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, tw = lane % 4;
        const uint8_t* word = qs + ((rg * n_units + u) * 32 + lane) * 16;
        const int64_t r0 = rg * 16 + g, r8 = r0 + 8;
        const size_t q = offsetof(BlockQ4_K, qs) + 32 * j;
        std::memcpy(block(r0, sb) + q + 4 * tw, word + 0, 4);
        std::memcpy(block(r8, sb) + q + 4 * tw, word + 4, 4);
        std::memcpy(block(r0, sb) + q + 16 + 4 * tw, word + 8, 4);
        std::memcpy(block(r8, sb) + q + 16 + 4 * tw, word + 12, 4);
      }
    }
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      for (int row = 0; row < 16; ++row) {
        uint8_t* b = block(rg * 16 + row, sb);
        unpack_k_head(meta + ((rg * n_sb + sb) * 16 + row) * 16, b, b + offsetof(BlockQ4_K, scales));
      }
    }
  }
  return raw;
}

TEST(TiledMatrix, LayoutDecodesToTheRawRows) {
  std::mt19937 rng(7);
  struct Case {
    GgmlType t;
    int64_t n_cols, n_rows;
  };
  for (const Case& c :
       {Case{GgmlType::kQ4_0, 64, 16}, Case{GgmlType::kQ4_0, 320, 48}, Case{GgmlType::kQ4_0, 2048, 64},
        Case{GgmlType::kQ4_K, 256, 16}, Case{GgmlType::kQ4_K, 1280, 32}, Case{GgmlType::kQ4_K, 8192, 16},
        Case{GgmlType::kQ6_K, 256, 16}, Case{GgmlType::kQ6_K, 1280, 48}, Case{GgmlType::kQ6_K, 8192, 16},
        Case{GgmlType::kQ8_0, 64, 16}, Case{GgmlType::kQ8_0, 320, 48}, Case{GgmlType::kQ8_0, 8192, 16},
        Case{GgmlType::kQ5_K, 256, 16}, Case{GgmlType::kQ5_K, 1280, 48}, Case{GgmlType::kQ5_K, 8192, 16}}) {
    const std::vector<uint8_t> m = random_matrix(c.t, c.n_cols, c.n_rows, rng);
    std::vector<uint8_t> tiled(m.size());
    ASSERT_TRUE(tile_matrix(c.t, m.data(), c.n_cols, c.n_rows, tiled));
    EXPECT_EQ(untile(c.t, tiled, c.n_cols, c.n_rows), m)
        << ggml_type_name(c.t) << " {" << c.n_cols << ", " << c.n_rows << "}";
  }
}

// 37 slices of 3 row groups: ranges cut through slices whatever the thread count.
TEST(TiledMatrix, StackOnThreadsEqualsSlicesOneByOne) {
  std::mt19937 rng(11);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_0}) {
    const int64_t n_cols = 512, n_rows = 48, n_slices = 37;
    const uint64_t slice = tiled_bytes(t, n_cols, n_rows);
    std::vector<uint8_t> stack;
    for (int64_t s = 0; s < n_slices; ++s) {
      const std::vector<uint8_t> m = random_matrix(t, n_cols, n_rows, rng);
      stack.insert(stack.end(), m.begin(), m.end());
    }
    std::vector<uint8_t> want(stack.size());
    for (int64_t s = 0; s < n_slices; ++s) {
      ASSERT_TRUE(
          tile_matrix(t, stack.data() + s * slice, n_cols, n_rows, std::span<uint8_t>(want.data() + s * slice, slice)));
    }
    for (int threads : {1, 2, 3, 7, 0}) {
      std::vector<uint8_t> got(stack.size(), 0xAB);
      ASSERT_TRUE(tile_matrix_stack(t, stack.data(), n_cols, n_rows, n_slices, got, threads));
      EXPECT_EQ(got, want) << ggml_type_name(t) << " threads " << threads;
    }
  }
}

TEST(TiledMatrix, TiledSizeIsTheRawSize) {
  EXPECT_EQ(tiled_bytes(GgmlType::kQ4_K, 512, 32), 2u * 32u * sizeof(BlockQ4_K));
  EXPECT_EQ(tiled_bytes(GgmlType::kQ4_0, 512, 32), 16u * 32u * sizeof(BlockQ4_0));
  EXPECT_EQ(tiled_bytes(GgmlType::kQ6_K, 512, 32), 2u * 32u * sizeof(BlockQ6_K));
  EXPECT_EQ(tiled_bytes(GgmlType::kQ8_0, 512, 32), 16u * 32u * sizeof(BlockQ8_0));
  EXPECT_EQ(tiled_bytes(GgmlType::kQ5_K, 512, 32), 2u * 32u * sizeof(BlockQ5_K));
}

TEST(TiledMatrix, RefusesShapesAndArguments) {
  EXPECT_FALSE(tiled_supports(GgmlType::kQ4_0, 32, 16));    // n_in not a multiple of 64
  EXPECT_FALSE(tiled_supports(GgmlType::kQ4_0, 64, 17));    // n_out not a multiple of 16
  EXPECT_FALSE(tiled_supports(GgmlType::kQ4_K, 128, 16));   // not whole super-blocks
  EXPECT_FALSE(tiled_supports(GgmlType::kQ6_K, 320, 16));   // not whole super-blocks
  EXPECT_FALSE(tiled_supports(GgmlType::kQ6_K, 256, 8));    // n_out not a multiple of 16
  EXPECT_FALSE(tiled_supports(GgmlType::kQ8_0, 32, 16));    // not whole units
  EXPECT_FALSE(tiled_supports(GgmlType::kBF16, 256, 16));   // other types keep gemv()
  EXPECT_FALSE(tiled_supports(GgmlType::kQ5_K, 320, 16));   // not whole super-blocks
  EXPECT_FALSE(tiled_supports(GgmlType::kQ4_0, 8256, 16));  // longer than the kernel takes
  std::vector<uint8_t> raw(18 * 2 * 17);
  std::vector<uint8_t> out(raw.size());
  EXPECT_FALSE(tile_matrix(GgmlType::kQ4_0, raw.data(), 64, 17, out));
  std::vector<uint8_t> small(10);
  EXPECT_FALSE(tile_matrix(GgmlType::kQ4_0, raw.data(), 64, 16, small));
  std::vector<uint8_t> two(2 * 18 * 2 * 16);
  EXPECT_FALSE(tile_matrix(GgmlType::kQ4_0, nullptr, 64, 16, std::span<uint8_t>(two.data(), two.size() / 2)));
  EXPECT_FALSE(tile_matrix_stack(GgmlType::kQ4_0, two.data(), 64, 16, 0, two));      // no slices
  EXPECT_FALSE(tile_matrix_stack(GgmlType::kQ4_0, two.data(), 64, 16, 3, two));      // room for 2
  EXPECT_FALSE(tile_matrix_stack(GgmlType::kQ4_0, two.data(), 64, 16, 2, two, -1));  // thread count
  EXPECT_TRUE(tile_matrix_stack(GgmlType::kQ4_0, two.data(), 64, 16, 2, two, 2));
}

}  // namespace
}  // namespace kestrel::gpu
