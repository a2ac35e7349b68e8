// block_test_util.h: what the gpu tests' random weight generators share about raw GGUF blocks — where a block keeps
// its f16 scales, random blocks with finite scales, and how one value of a plain type is written. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/quant/blocks.h"
#include "core/quant/quant.h"

namespace kestrel::gpu::test {

// Byte offsets of the f16 scales inside one block (empty for plain types).
inline std::vector<size_t> scale_offsets(GgmlType t) {
  switch (t) {
    case GgmlType::kQ8_0: return {offsetof(BlockQ8_0, d)};
    case GgmlType::kQ4_0: return {offsetof(BlockQ4_0, d)};
    case GgmlType::kQ4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case GgmlType::kQ5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case GgmlType::kQ6_K: return {offsetof(BlockQ6_K, d)};
    default: return {};
  }
}

// n bytes of random blocks of type t whose f16 scales are finite, in [-2, 2] (a re-tiling moves bytes; any scale bits
// would do, finite ones read better in a failure).
inline std::vector<uint8_t> random_blocks(GgmlType t, uint64_t n, std::mt19937& rng) {
  std::vector<uint8_t> m(n);
  for (auto& b : m) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  const size_t block_bytes = ggml_type_traits(t).block_bytes;
  for (size_t blk = 0; blk < m.size() / block_bytes; ++blk) {
    for (size_t off : scale_offsets(t)) {
      const uint16_t h = f32_to_fp16(scale(rng));
      std::memcpy(&m[blk * block_bytes + off], &h, sizeof(h));
    }
  }
  return m;
}

// Writes f as element i of a row of plain type t (F32, F16 or BF16) starting at m.
inline void store_plain(GgmlType t, float f, size_t i, unsigned char* m) {
  if (t == GgmlType::kF32) {
    std::memcpy(m + 4 * i, &f, 4);
    return;
  }
  const uint16_t h = t == GgmlType::kF16 ? f32_to_fp16(f) : f32_to_bf16(f);
  std::memcpy(m + 2 * i, &h, 2);
}

}  // namespace kestrel::gpu::test
