// imma_tile.cuh: GEMV v4's per-group arithmetic on the re-tiled Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 layouts
// (gpu/memory/tiled_matrix.h) and the prepared activations (gpu/kernels/imma_prepare.cuh): the integer tensor-core MMAs
// (u8 × s8 for the Q4 types and Q5_K, s8 × s8 for Q6_K and Q8_0), a warp's registers for one group of a row group, and
// the multiply of one group for one vector pair. gemv_imma.cu's head derives the arithmetic and multiplies with it.
// Device code only; include from .cu files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/gguf/ggml_type.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/pdl.cuh"
#include "gpu/memory/tiled_matrix.h"

namespace kestrel::gpu::imma_tile {

using imma_prep::kUnitsPerSlice;
constexpr int kTileRows = 16;
constexpr int kUnitElems = 64;
constexpr uint32_t kNibbles = 0x0F0F0F0Fu;
constexpr int kMagic = 0x4B400000;  // bits of 12582912.0f = 1.5·2^23
constexpr float kMagicF = 12582912.0f;

// d = A·B + C with C = {c0, c1, c0, c1} (rows g and g + 8 start alike): C read from registers the caller keeps.
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1, int c0, int c1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%10,%11};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1));
}

// d = A·B, m16n8k32 s8 × s8 (Q8_0: a block's quants are A registers as they stand); fragments as mma_u8s8's.
__device__ __forceinline__ void mma_s8s8(int (&d)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0));
}

// d = A·B, m16n8k16 s8 × s8 (Q6_K: one 16-element sub-block, one scale, per MMA). A {row g k 4t.., row g+8 k 4t..},
// B {k 4t..4t+3 col g} (the first or second register of a k32 B fragment), D as mma_u8s8's.
__device__ __forceinline__ void mma_s8s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

// One group's weights for one warp: 4 units of a row group, and their scales.
struct WeightBuf {
  uint4 w[kUnitsPerSlice];   // Q6_K: the units' low nibbles; Q8_0: each unit's first block
  uint4 w2[kUnitsPerSlice];  // Q8_0: each unit's second block
  uint2 m0[kUnitsPerSlice];  // Q4_0, Q8_0: d of (g, blk 0), (g+8, blk 0), (g, blk 1), (g+8, blk 1)
  uint4 mk[2];               // Q4_K, Q5_K: 16-byte heads of rows g and g + 8 for the super-block
  uint4 h5;                  // Q5_K: the units' high-bit words
  uint4 qh[2];               // Q6_K: high bits of units 0-1, 2-3
  uint4 sc6[2];              // Q6_K: the 16 int8 scales of rows g, g + 8
  uint32_t d6;               // Q6_K: d of rows g (low half), g + 8 (f16)
};

// Bytes of one group (256 columns) of a row group in the tiled layout (tiled_matrix.h): quants, then scales.
template <GgmlType T>
inline constexpr int kGroupQuantBytes = kUnitsPerSlice* tiled_unit_quant_bytes(T);
template <GgmlType T>
inline constexpr int kGroupMetaBytes = kUnitsPerSlice* tiled_unit_meta_bytes(T);

// A pair's activations for one group, where a lane finds them: its B fragments (vector vf), its digit sums and
// group scale (vector vd, the owner of its C columns). A missing second vector reads the first one's (its C columns
// are never stored), so no load is predicated. Loaded a unit at a time: written by the kernel before, so with ordinary
// loads (pdl.cuh, ld_dep); kL2: through L2 only (ld.global.cg), for activations another block wrote during the same
// kernel.
template <bool kL2 = false>
struct XSourceT {
  const uint8_t* frag;   // unit i at + 256 i (uint4)
  const uint8_t* dsum;   // unit i at + 16 i (int2: D of blocks 0 and 1 for this lane's digit pair)
  const uint8_t* scale;  // f32
  __device__ __forceinline__ uint4 b(int i) const { return ld(reinterpret_cast<const uint4*>(frag + 256 * i)); }
  __device__ __forceinline__ int2 d(int i) const { return ld(reinterpret_cast<const int2*>(dsum + 16 * i)); }
  __device__ __forceinline__ float s() const { return ld(reinterpret_cast<const float*>(scale)); }
  template <class V>
  __device__ __forceinline__ static V ld(const V* p) {
    if constexpr (kL2) return __ldcg(p);
    return ld_dep(p);
  }
};
using XSource = XSourceT<false>;

// A pair's activations for one group loaded into registers at once (XSourceT's interface; the digit sums only for
// the types whose multiply reads them), for a kernel that issues them ahead of its weights.
template <GgmlType T>
struct XRegs {
  static constexpr bool kDigitSums = T == GgmlType::kQ4_0 || T == GgmlType::kQ4_K || T == GgmlType::kQ5_K;
  uint4 f[kUnitsPerSlice];
  int2 dd[kUnitsPerSlice];
  float sc;
  __device__ __forceinline__ explicit XRegs(const XSource& x) {
#pragma unroll
    for (int i = 0; i < kUnitsPerSlice; ++i) {
      f[i] = x.b(i);
      if constexpr (kDigitSums) dd[i] = x.d(i);
    }
    sc = x.s();
  }
  __device__ __forceinline__ uint4 b(int i) const { return f[i]; }
  __device__ __forceinline__ int2 d(int i) const { return dd[i]; }
  __device__ __forceinline__ float s() const { return sc; }
};

// Where a lane's words for group grp of row group rg lie in a tiled matrix of n_units units a row (tiled_matrix.h), as
// pointers from its start `base`: qs, the lane's 16-byte quant word of the group's first unit (+ 512 per unit; Q8_0
// + 1024, its second block at + 512; Q5_K's high-bit word at + 2048); meta, its scales (Q4_0, Q8_0: + 64 per unit;
// Q4_K, Q5_K: row g's super-block head, row g + 8's at + 128). The K-quants have whole groups (n_units = 4·groups),
// so every type's scales of a group start at tile0 · kGroupMetaBytes / 4.
// Q6_K: qs at the group's first low-nibble word (+ 3072 per group), meta at the lane's row scales (+ 288 per group).
template <GgmlType T>
__device__ __forceinline__ void tile_lane(const uint8_t* base, size_t meta_off, int n_units, int rg, int grp, int lane,
                                          const uint8_t*& qs, const uint8_t*& meta) {
  const size_t tile0 = static_cast<size_t>(rg) * n_units + static_cast<size_t>(grp) * kUnitsPerSlice;
  constexpr int kLaneMeta = T == GgmlType::kQ4_K || T == GgmlType::kQ5_K ? 16 : (T == GgmlType::kQ6_K ? 32 : 8);
  qs = base + tile0 * (kGroupQuantBytes<T> / kUnitsPerSlice) + lane * 16;
  meta = base + meta_off + tile0 * (kGroupMetaBytes<T> / kUnitsPerSlice) + (lane / 4) * kLaneMeta;
}

// Q6_K: from a lane's meta pointer to its rows' d (the d's follow the group's 256 bytes of scales, 4 bytes per g).
__device__ __forceinline__ int q6_d_delta(int lane) { return 256 - (lane / 4) * 28; }

// A lane's byte offsets in one prepared vector (imma_prepare.cuh's layout) for group grp, lane = 4g + t: its B fragment
// of the group's first unit (+ 256 per unit), its digit sums (+ 16 per unit), the group's scale.
__device__ __forceinline__ size_t x_frag_off(int grp, int g, int t) {
  return (static_cast<size_t>(grp) * kUnitsPerSlice * 16 + (g % 4) * 4 + t) * 16;
}
__device__ __forceinline__ size_t x_dsum_off(const imma_prep::XLayout& lay, int grp, int t) {
  return lay.frag_bytes() + (static_cast<size_t>(grp) * kUnitsPerSlice * 2 + (t % 2)) * 8;
}
__device__ __forceinline__ size_t x_scale_off(const imma_prep::XLayout& lay, int grp) {
  return lay.frag_bytes() + lay.dsum_bytes() + static_cast<size_t>(grp) * 4;
}

__device__ __forceinline__ float half_bits(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// Q6_K: the A register of sub-block s (0..3) of a unit for one row: the low nibbles from its ql word (sub-blocks s,
// s + 1 share a word, s in the low nibbles when even), bits 2s, 2s + 1 of each qh byte as bits 4, 5, then q − 32 as
// a signed byte: (q + 96) ^ 0x80 per byte (q + 96 <= 159: no carry between bytes).
__device__ __forceinline__ uint32_t q6_a(uint32_t ql, uint32_t qh, int s) {
  const uint32_t lo = (s % 2 == 1 ? ql >> 4 : ql) & kNibbles;
  const uint32_t hi = (s == 0 ? qh << 4 : (s == 1 ? qh << 2 : (s == 2 ? qh : qh >> 2))) & 0x30303030u;
  return ((lo | hi) + 0x60606060u) ^ 0x80808080u;
}

// Byte s of w, sign-extended (prmt with the sign-replicating selectors).
__device__ __forceinline__ int sbyte(uint32_t w, int s) {
  const uint32_t sel = static_cast<uint32_t>(s) | (static_cast<uint32_t>(s | 8) * 0x1110u);
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(sel));
  return static_cast<int>(r);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// One Q6_K group (a super-block of rows g, g + 8) for one pair: per 16-element sub-block one s8 × s8 MMA, its two
// digit columns times the sub-block's scale summed in int32 per digit (|c| <= 16·32·64 = 2^15, |sc| <= 128: < 2^26
// over the super-block), then d · (128·I_2h + I_2h+1) in f32, in units of digit 2h + 1 like the Q4 types.
template <class XS>
__device__ __forceinline__ void multiply_add_q6_k(const WeightBuf& src, const XS& x, float (&sum)[2]) {
  int is[2][2] = {{0, 0}, {0, 0}};  // [row g, g + 8][digit 2h, 2h + 1]
#pragma unroll
  for (int i = 0; i < kUnitsPerSlice; ++i) {
    const uint4 w = src.w[i];
    const uint4 f = x.b(i);
    const uint32_t hg = word(src.qh[i / 2], 2 * (i % 2));
    const uint32_t hg8 = word(src.qh[i / 2], 2 * (i % 2) + 1);
    const uint32_t scg = word(src.sc6[0], i);
    const uint32_t scg8 = word(src.sc6[1], i);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      int c[4];
      mma_s8s8_k16(c, q6_a(s < 2 ? w.x : w.z, hg, s), q6_a(s < 2 ? w.y : w.w, hg8, s), word(f, s));
      const int k0 = sbyte(scg, s);
      const int k8 = sbyte(scg8, s);
      is[0][0] += c[0] * k0;
      is[0][1] += c[1] * k0;
      is[1][0] += c[2] * k8;
      is[1][1] += c[3] * k8;
    }
  }
  const float xs = x.s();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float d = half_bits(r == 0 ? src.d6 & 0xFFFFu : src.d6 >> 16);
    const float v = __fmaf_rn(static_cast<float>(is[r][0]), 128.0f, static_cast<float>(is[r][1]));
    sum[r] = __fadd_rn(sum[r], __fmul_rn(xs, __fmul_rn(d, v)));
  }
}

// Unit i's 24-bit field of a K-quant super-block head (d, dmin, then four fields): sc[2i] | sc[2i+1] << 6 |
// m[2i] << 12 | m[2i+1] << 18 (tile_matrix's re-packing), with one funnel shift.
__device__ __forceinline__ uint32_t k_field(const uint4& hd, int i) {
  const uint32_t lo = i < 2 ? hd.y : (i == 2 ? hd.z : hd.w);
  const uint32_t hi = i < 2 ? hd.z : hd.w;
  return __funnelshift_r(lo, hi, (24 * i) & 31);
}

// Q5_K: the fifth bits of A register r of sub-block 2j + h (bit f = 4h + r of each byte of the unit's high-bit word),
// moved to bit 4 of each byte.
__device__ __forceinline__ uint32_t q5_high(uint32_t qh, int f) {
  return (f <= 4 ? qh << (4 - f) : qh >> (f - 4)) & 0x10101010u;
}

// One Q5_K group (a super-block of rows g, g + 8) for one pair: Q4_K's multiply with the fifth bit OR-ed into each A
// byte (q <= 31), and the int32 sums kept per digit (|c| <= 32·31·64 < 2^16, times sc < 64, over 8 sub-blocks:
// < 2^25; Q4_K's joined 128·c0 + c1 would pass 2^31 here), joined in f32 at the super-block's end.
template <class XS>
__device__ __forceinline__ void multiply_add_q5_k(const WeightBuf& src, const XS& x, float (&sum)[2]) {
  int is[2][2] = {{0, 0}, {0, 0}};  // [row g, g + 8][digit 2h, 2h + 1] · sc
  int msum[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < kUnitsPerSlice; ++i) {
    const uint4 w = src.w[i];
    const uint4 f = x.b(i);
    const int2 ds = x.d(i);
    const uint32_t qh = i == 0 ? src.h5.x : (i == 1 ? src.h5.y : (i == 2 ? src.h5.z : src.h5.w));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int sh = 4 * h;
      int c[4];
      mma_u8s8(c, ((w.x >> sh) & kNibbles) | q5_high(qh, 4 * h), ((w.y >> sh) & kNibbles) | q5_high(qh, 4 * h + 1),
               ((w.z >> sh) & kNibbles) | q5_high(qh, 4 * h + 2), ((w.w >> sh) & kNibbles) | q5_high(qh, 4 * h + 3),
               h == 0 ? f.x : f.z, h == 0 ? f.y : f.w, 0, 0);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t fld = k_field(src.mk[r], i);
        const int sc = static_cast<int>((fld >> (6 * h)) & 63u);
        const int mn = static_cast<int>((fld >> (12 + 6 * h)) & 63u);
        is[r][0] += c[2 * r] * sc;
        is[r][1] += c[2 * r + 1] * sc;
        msum[r] += mn * (h == 0 ? ds.x : ds.y);
      }
    }
  }
  float acc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float d = half_bits(src.mk[r].x & 0xFFFFu);
    const float dmin = half_bits(src.mk[r].x >> 16);
    const float v = __fmaf_rn(static_cast<float>(is[r][0]), 128.0f, static_cast<float>(is[r][1]));
    acc[r] = __fmaf_rn(d, v, -__fmul_rn(dmin, static_cast<float>(msum[r])));
  }
  const float xs = x.s();
  sum[0] = __fadd_rn(sum[0], __fmul_rn(xs, acc[0]));
  sum[1] = __fadd_rn(sum[1], __fmul_rn(xs, acc[1]));
}

// One Q8_0 group (eight blocks of rows g, g + 8) for one pair: per block one s8 × s8 MMA, its digit columns joined in
// int32 (|128·c0 + c1| < 128·32·128·64 + 2^18 < 2^26) and converted once (rounded to 24 bits: the joined sum no
// longer fits Q4_0's exact 2^22 float trick), times the block's d, in units of digit 2h + 1 like the Q4 types.
template <class XS>
__device__ __forceinline__ void multiply_add_q8_0(const WeightBuf& src, const XS& x, float (&sum)[2]) {
  float acc[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kUnitsPerSlice; ++i) {
    const uint4 f = x.b(i);
    const uint2 m0 = src.m0[i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int c[4];
      mma_s8s8(c, h == 0 ? src.w[i] : src.w2[i], h == 0 ? f.x : f.z, h == 0 ? f.y : f.w);
      const uint32_t sc = h == 0 ? m0.x : m0.y;
      acc[0] = __fmaf_rn(static_cast<float>(c[0] * 128 + c[1]), half_bits(sc & 0xFFFFu), acc[0]);
      acc[1] = __fmaf_rn(static_cast<float>(c[2] * 128 + c[3]), half_bits(sc >> 16), acc[1]);
    }
  }
  const float xs = x.s();
  sum[0] = __fadd_rn(sum[0], __fmul_rn(xs, acc[0]));
  sum[1] = __fadd_rn(sum[1], __fmul_rn(xs, acc[1]));
}

// One group of one pair, added to the lane's running sums for rows g and g + 8 of its vector (t >> 1):
// sum[r] += s_G · (the lane's two digits' group sum), in units of digit 2h + 1 (h = t & 1) — pair_sum() later scales
// them and adds the lane pair. A lane's two C columns are digits 2h and 2h + 1 of one vector; per MMA they are joined
// exactly in int32 (128·c0 + c1, |.| < 2^22), so each block costs one scaling per row, and the pair is scaled and added
// once per slice (pair_sum), not once per group.
template <GgmlType T, class XS>
__device__ __forceinline__ void multiply_add(const WeightBuf& src, const XS& x, float (&sum)[2]) {
  if constexpr (T == GgmlType::kQ6_K) {
    multiply_add_q6_k(src, x, sum);
    return;
  }
  if constexpr (T == GgmlType::kQ8_0) {
    multiply_add_q8_0(src, x, sum);
    return;
  }
  if constexpr (T == GgmlType::kQ5_K) {
    multiply_add_q5_k(src, x, sum);
    return;
  }
  float acc[2] = {0.0f, 0.0f};  // rows g, g + 8, in units of digit 2h + 1
  [[maybe_unused]] int isum[2] = {0, 0};
  [[maybe_unused]] int msum[2] = {0, 0};
  [[maybe_unused]] uint4 mk[2];
  if constexpr (T == GgmlType::kQ4_K) mk[0] = src.mk[0], mk[1] = src.mk[1];
#pragma unroll
  for (int i = 0; i < kUnitsPerSlice; ++i) {
    const uint4 w = src.w[i];
    const uint4 f = x.b(i);
    const int2 ds = x.d(i);
    [[maybe_unused]] uint2 m0;
    if constexpr (T == GgmlType::kQ4_0) m0 = src.m0[i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t b0 = h == 0 ? f.x : f.z;
      const uint32_t b1 = h == 0 ? f.y : f.w;
      const int dd = h == 0 ? ds.x : ds.y;  // D of this block
      if constexpr (T == GgmlType::kQ4_0) {
        const uint32_t p = h == 0 ? w.x : w.z;  // row g
        const uint32_t q = h == 0 ? w.y : w.w;  // row g + 8
        // c1 starts at 1.5·2^23 − 8·D: 128·c0 + c1 = 1.5·2^23 + Σ(q − 8)·(128·d_2h + d_2h+1), exact as a float.
        int c[4];
        mma_u8s8(c, p & kNibbles, q & kNibbles, (p >> 4) & kNibbles, (q >> 4) & kNibbles, b0, b1, 0, kMagic - 8 * dd);
        const uint32_t sc = h == 0 ? m0.x : m0.y;
        const float s_g = half_bits(sc & 0xFFFFu);
        const float s_g8 = half_bits(sc >> 16);
        acc[0] = __fmaf_rn(__int_as_float(c[0] * 128 + c[1]) - kMagicF, s_g, acc[0]);
        acc[1] = __fmaf_rn(__int_as_float(c[2] * 128 + c[3]) - kMagicF, s_g8, acc[1]);
      } else {
        const int sh = 4 * h;
        int c[4];
        mma_u8s8(c, (w.x >> sh) & kNibbles, (w.y >> sh) & kNibbles, (w.z >> sh) & kNibbles, (w.w >> sh) & kNibbles, b0,
                 b1, 0, 0);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t fld = k_field(mk[r], i);
          const int sc = static_cast<int>((fld >> (6 * h)) & 63u);
          const int mn = static_cast<int>((fld >> (12 + 6 * h)) & 63u);
          // |128·c0 + c1| < 2^22, times sc < 64, over 8 sub-blocks: < 2^31.
          isum[r] += (c[2 * r] * 128 + c[2 * r + 1]) * sc;
          msum[r] += mn * dd;
        }
      }
    }
  }
  if constexpr (T == GgmlType::kQ4_K) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float d = half_bits(mk[r].x & 0xFFFFu);
      const float dmin = half_bits(mk[r].x >> 16);
      acc[r] = __fmaf_rn(d, static_cast<float>(isum[r]), -__fmul_rn(dmin, static_cast<float>(msum[r])));
    }
  }
  const float xs = x.s();
  sum[0] = __fadd_rn(sum[0], __fmul_rn(xs, acc[0]));
  sum[1] = __fadd_rn(sum[1], __fmul_rn(xs, acc[1]));
}

// The running sums of digits 2h, 2h + 1 (lane t = 2v + h) in units of digit 1 (h = 0) or 3: their value.
constexpr float kDigitUnit0 = 1.0f / 128.0f;      // 128^-1
constexpr float kDigitUnit1 = 1.0f / 2097152.0f;  // 128^-3
__device__ __forceinline__ float pair_value(float h0, float h1) {
  return __fadd_rn(__fmul_rn(h0, kDigitUnit0), __fmul_rn(h1, kDigitUnit1));
}

// A slice's end: each lane's two running sums become its vector's row sums (all four digits), pair_value of the lane
// pair t, t ^ 1 in every lane of it. Every lane of the warp calls it.
__device__ __forceinline__ void pair_sum(float (&sum)[2], int lane) {
  const float unit = (lane & 1) ? kDigitUnit1 : kDigitUnit0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float p = __fmul_rn(sum[r], unit);
    sum[r] = __fadd_rn(p, __shfl_xor_sync(0xFFFFFFFFu, p, 1));
  }
}

}  // namespace kestrel::gpu::imma_tile
