// Device-side dequantization of GGUF blocks, bit-exact with core/quant's scalar dequantize_row.
//
// For kernels (get_rows today, the GEMV kernels next) that read weights in their raw block layout
// (core/quant/blocks.h). Each format has a traits struct:
//   Dequant<T>::Block                      the block type (float / uint16_t for the plain types)
//   Dequant<T>::kBlockElems                elements per block
//   Dequant<T>::elem(const Block*, int i)  element i in [0, kBlockElems) of one block, as f32
// plus the pieces a GEMV wants to hoist out of its inner loop (a sub-block's step and offset, one quant).
//
// Bit-exactness: every product and difference uses __fmul_rn/__fsub_rn, which nvcc never fuses into an FMA, in
// the same order as the scalar code ((d * sc) * q - (dmin * m) for Q4_K/Q5_K, (d * sc) * q for Q6_K, q * d for
// Q8_0/Q4_0), and the f16/bf16 conversions are integer-only, so the result does not depend on -ftz or --fmad.
// Alignment: blocks must be 2-byte aligned (4 for f32), which holds for GGUF data at any row of these types.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/gguf/ggml_type.h"
#include "core/quant/blocks.h"

namespace kestrel::gpu {

// ---- f16 / bf16 -------------------------------------------------------------------------------------------------

// IEEE half -> f32, exact; NaN keeps its payload and is made quiet (as core's fp16_to_f32).
__device__ __forceinline__ float dq_fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1Fu) {
    bits = sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    const int shift = __clz(static_cast<int>(mant)) - 21;  // moves the leading one to bit 10
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (((mant << shift) & 0x3FFu) << 13);
  }
  return __uint_as_float(bits);
}

__device__ __forceinline__ float dq_bf16_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// ---- Q4_K / Q5_K packed 6-bit scales (ggml's get_scale_min_k4) ----------------------------------------------------

// Sub-block j in [0, 8): its 6-bit scale and min from the 12 packed bytes.
__device__ __forceinline__ void dq_k4_scale_min(int j, const uint8_t* packed, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 0x3F;
    *min = packed[j + 4] & 0x3F;
  } else {
    *scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Step (d * sc) and offset (dmin * m) of sub-block j of a Q4_K or Q5_K block: value = step * q - offset.
template <class KBlock>
__device__ __forceinline__ void dq_k4_step_offset(const KBlock* b, int j, float* step, float* offset) {
  int sc;
  int m;
  dq_k4_scale_min(j, b->scales, &sc, &m);
  *step = __fmul_rn(dq_fp16_to_f32(b->d), static_cast<float>(sc));
  *offset = __fmul_rn(dq_fp16_to_f32(b->dmin), static_cast<float>(m));
}

// ---- traits ---------------------------------------------------------------------------------------------------

template <GgmlType T>
struct Dequant;

template <>
struct Dequant<GgmlType::kF32> {
  using Block = float;
  static constexpr int kBlockElems = 1;
  __device__ static float elem(const Block* b, int /*i*/) { return *b; }
};

template <>
struct Dequant<GgmlType::kF16> {
  using Block = uint16_t;
  static constexpr int kBlockElems = 1;
  __device__ static float elem(const Block* b, int /*i*/) { return dq_fp16_to_f32(*b); }
};

template <>
struct Dequant<GgmlType::kBF16> {
  using Block = uint16_t;
  static constexpr int kBlockElems = 1;
  __device__ static float elem(const Block* b, int /*i*/) { return dq_bf16_to_f32(*b); }
};

template <>
struct Dequant<GgmlType::kQ8_0> {
  using Block = BlockQ8_0;
  static constexpr int kBlockElems = kQK8_0;
  __device__ static float elem(const Block* b, int i) {
    return __fmul_rn(static_cast<float>(b->qs[i]), dq_fp16_to_f32(b->d));
  }
};

template <>
struct Dequant<GgmlType::kQ4_0> {
  using Block = BlockQ4_0;
  static constexpr int kBlockElems = kQK4_0;
  // Quant of element i, in [-8, 7]: low nibbles are elements 0..15, high nibbles 16..31.
  __device__ static int quant(const Block* b, int i) {
    const uint8_t byte = b->qs[i & 15];
    return (i < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
  }
  __device__ static float elem(const Block* b, int i) {
    return __fmul_rn(static_cast<float>(quant(b, i)), dq_fp16_to_f32(b->d));
  }
};

template <>
struct Dequant<GgmlType::kQ4_K> {
  using Block = BlockQ4_K;
  static constexpr int kBlockElems = kQK_K;
  // Sub-block (32 elements) of element i, and its quant in [0, 15]: chunk c = i / 64 packs sub-block 2c in the low
  // nibbles of qs[32c .. 32c + 31] and sub-block 2c + 1 in their high nibbles.
  __device__ static int sub_block(int i) { return i / 32; }
  __device__ static int quant(const Block* b, int i) {
    const uint8_t byte = b->qs[32 * (i / 64) + (i & 31)];
    return (i & 32) ? (byte >> 4) : (byte & 0x0F);
  }
  __device__ static float elem(const Block* b, int i) {
    float step;
    float offset;
    dq_k4_step_offset(b, sub_block(i), &step, &offset);
    return __fsub_rn(__fmul_rn(step, static_cast<float>(quant(b, i))), offset);
  }
};

template <>
struct Dequant<GgmlType::kQ5_K> {
  using Block = BlockQ5_K;
  static constexpr int kBlockElems = kQK_K;
  __device__ static int sub_block(int i) { return i / 32; }
  // Quant in [0, 31]: Q4_K's nibble plus 16 * bit (sub-block) of qh[i % 32].
  __device__ static int quant(const Block* b, int i) {
    const uint8_t byte = b->qs[32 * (i / 64) + (i & 31)];
    const int low = (i & 32) ? (byte >> 4) : (byte & 0x0F);
    const int high = (b->qh[i & 31] >> sub_block(i)) & 1;
    return low | (high << 4);
  }
  __device__ static float elem(const Block* b, int i) {
    float step;
    float offset;
    dq_k4_step_offset(b, sub_block(i), &step, &offset);
    return __fsub_rn(__fmul_rn(step, static_cast<float>(quant(b, i))), offset);
  }
};

template <>
struct Dequant<GgmlType::kQ6_K> {
  using Block = BlockQ6_K;
  static constexpr int kBlockElems = kQK_K;
  // Element i: half h = i / 128, group g = (i % 128) / 32, l = i % 32. Groups 0/1 use the low nibble of
  // ql[64h + l] / ql[64h + 32 + l], groups 2/3 the high nibble of the same bytes; bits 2g..2g+1 of qh[32h + l]
  // are the top two bits; the scale is scales[8h + l / 16 + 2g].
  __device__ static int scale_index(int i) {
    const int h = i / 128;
    const int g = (i % 128) / 32;
    return 8 * h + (i % 32) / 16 + 2 * g;
  }
  // Quant in [-32, 31].
  __device__ static int quant(const Block* b, int i) {
    const int h = i / 128;
    const int g = (i % 128) / 32;
    const int l = i % 32;
    const uint8_t byte = b->ql[64 * h + l + ((g & 1) ? 32 : 0)];
    const int low = g < 2 ? (byte & 0x0F) : (byte >> 4);
    const int high = (b->qh[32 * h + l] >> (2 * g)) & 3;
    return (low | (high << 4)) - 32;
  }
  __device__ static float elem(const Block* b, int i) {
    const float step = __fmul_rn(dq_fp16_to_f32(b->d), static_cast<float>(b->scales[scale_index(i)]));
    return __fmul_rn(step, static_cast<float>(quant(b, i)));
  }
};

// The one place that maps a run-time GgmlType onto the Dequant<T> specialisations: calls
// `f(std::integral_constant<GgmlType, T>{})` for a type that has one and returns its result, else `otherwise`.
// Every op that instantiates a kernel per weight type dispatches through this, so adding a type is one line here.
template <class R, class F>
R dispatch_dequant_type(GgmlType type, F&& f, R otherwise) {
  switch (type) {
    case GgmlType::kF32: return f(std::integral_constant<GgmlType, GgmlType::kF32>{});
    case GgmlType::kF16: return f(std::integral_constant<GgmlType, GgmlType::kF16>{});
    case GgmlType::kBF16: return f(std::integral_constant<GgmlType, GgmlType::kBF16>{});
    case GgmlType::kQ8_0: return f(std::integral_constant<GgmlType, GgmlType::kQ8_0>{});
    case GgmlType::kQ4_0: return f(std::integral_constant<GgmlType, GgmlType::kQ4_0>{});
    case GgmlType::kQ4_K: return f(std::integral_constant<GgmlType, GgmlType::kQ4_K>{});
    case GgmlType::kQ5_K: return f(std::integral_constant<GgmlType, GgmlType::kQ5_K>{});
    case GgmlType::kQ6_K: return f(std::integral_constant<GgmlType, GgmlType::kQ6_K>{});
    default: return otherwise;
  }
}

// True for the types dispatch_dequant_type() handles.
inline bool has_dequant(GgmlType type) {
  return dispatch_dequant_type(
      type, [](auto) { return true; }, false);
}

}  // namespace kestrel::gpu
