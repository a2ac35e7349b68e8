// block_test_util.h: what the gpu tests' random weight generators share about raw GGUF blocks — where a block keeps
// its f16 scales, and how one value of a plain type is written. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
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
