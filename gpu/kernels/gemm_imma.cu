// gemm_imma (see gemm_imma.h): a warp multiplies 4 row groups × one segment of up to 8 vectors, unit by unit of 64
// columns; the fragments, the C start value and the scaling are gemv_imma's (gemv_imma.cu's head derives them;
// imma_tile.cuh's multiply_add is the one-row-group form of the loop below), per type:
//   Q4_0  u8 × s8, C starting at the magic value: each block's exact sum scaled in f32 by its d.
//   Q4_K  u8 × s8: a unit's two sub-block sums times their 6-bit scales in int32, the mins times the digit sums in
//         int32 over the super-block, d and dmin once a super-block.
//   Q5_K  Q4_K's with the fifth bits OR-ed into the A bytes (q <= 31); a unit's int32 sum goes to f32 once a unit (a
//         super-block's would pass 2^31).
//   Q6_K  s8 × s8 m16n8k16, one MMA per 16-element sub-block times its int8 scale, in int32 per two sub-blocks, to
//         f32, d once a super-block.
//   Q8_0  s8 × s8: each block's sum (rounded to f32: |sum| passes 2^24) scaled by its d.
//
// An MMA's 8 columns are the digits of its vectors: with four digits a pair of vectors (column 4v + digit; lane t's
// two C columns are digits 2(t & 1), 2(t & 1) + 1 of vector t >> 1, joined across the lane pair at the end), with two
// digits a quad (column 2v + digit; lane t's C columns are both digits of vector t, so a lane ends with its vector's
// sums). Two digits read the prepared form's first two digit words and the digit sums of the first pair, which are
// exactly the two-digit form's (imma_prepare.cuh: D = 128·Σd0 + Σd1). Either way a lane joins its two columns as
// 128·c0 + c1, so the per-type arithmetic is the same for both.
//
// Loads: each lane copies its own A words of a unit (4 row groups: 16 bytes of quants, Q8_0 32; per unit 8 bytes of
// scales (Q4_0, Q8_0), 4 of fifth bits (Q5_K) or 8 of high bits (Q6_K)) and B words (per vector set: 16 bytes of
// digits, 8 of digit sums for the types with an offset or mins) into its own shared-memory slots with cp.async,
// kStages - 1 units ahead of the multiply, and reads back only what it copied; a super-block's heads (Q4_K, Q5_K: d,
// dmin, the scales and mins of rows g and g + 8; Q6_K: their 16 int8 scales and d) go into a two-slot ring with the
// super-block's first unit, copied by lanes t = 0..2 of each g and shared with the others after a __syncwarp. No
// block barriers: the warps of a block run apart. The copies need no registers while in flight, so the 200-odd
// registers of the accumulators and one unit's fragments leave room for two blocks of four warps an SM (loading into
// registers one unit ahead, one block of eight warps, measured slower). Every vector set is multiplied even past a
// segment's n_vec: a branch per set would put each MMA in its own basic block, and nothing would overlap the MMAs'
// latency.
#include <algorithm>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gemm_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/imma_tile.cuh"
#include "gpu/kernels/smem_optin.cuh"

namespace kestrel::gpu {
namespace {

using imma_prep::kUnitsPerSlice;
using imma_prep::x_layout;
using imma_prep::XLayout;
using imma_tile::half_bits;
using imma_tile::k_field;
using imma_tile::kDigitUnit0;
using imma_tile::kMagic;
using imma_tile::kMagicF;
using imma_tile::kNibbles;
using imma_tile::kTileRows;
using imma_tile::kUnitElems;
using imma_tile::mma_s8s8;
using imma_tile::mma_s8s8_k16;
using imma_tile::mma_u8s8;
using imma_tile::pair_sum;
using imma_tile::q5_high;
using imma_tile::q6_a;
using imma_tile::sbyte;
using imma_tile::word;

constexpr int kRG = 4;      // row groups a warp holds
constexpr int kWarps = 4;   // warps of a block, along rows: a block is 256 rows × one segment
constexpr int kStages = 4;  // units in flight per warp (kStages - 1 ahead of the one multiplied)
constexpr int kTileRowGroups = kWarps * kRG;
constexpr int kMaxSets = 4;  // vector sets of a segment at four digits (pairs)

// A warp's vector sets for kDigits digits: sets of 8 / kDigits vectors (one MMA's columns), a segment's worth.
template <int kDigits>
struct Sets {
  static_assert(kDigits == 4 || kDigits == 2, "four or two digits");
  static constexpr int kPerSet = 8 / kDigits;                   // vectors an MMA holds
  static constexpr int kCount = kImmaSegmentVectors / kPerSet;  // sets a warp holds
  static constexpr int kLanesPerVector = kDigits / 2;           // lanes t whose C columns are one vector's digits
  static_assert(kCount * kPerSet == kImmaSegmentVectors && kCount <= kMaxSets, "a warp holds one segment");
};

// Where a type's bytes lie (tiled_matrix.h) and how a warp stages them. A unit's A quants of a row group lie at
// (u / 4) · kGroupQ + (u % 4) · kUnitQ + lane · 16 from the row group's start (Q8_0: two words, + 512). Its per-unit
// extra, kExtra bytes a lane: Q4_0 and Q8_0 the rows' d's in the scales part (+ 64 a unit); Q5_K the unit's word of the
// super-block's fifth bits (at 2048 + lane · 16 + 4 · (u % 4) from the super-block's start); Q6_K the unit's half of
// its pair's high bits (at 2048 + 512 · ((u % 4) / 2) + lane · 16 + 8 · (u % 2)). A super-block's heads lie in the
// scales part, kGroupMeta bytes a super-block (the kernel's wm offsets).
template <GgmlType T>
struct Layout {
  static constexpr bool kQ4_0 = T == GgmlType::kQ4_0, kQ4_K = T == GgmlType::kQ4_K, kQ5_K = T == GgmlType::kQ5_K,
                        kQ6_K = T == GgmlType::kQ6_K, kQ8_0 = T == GgmlType::kQ8_0;
  static_assert(kQ4_0 || kQ4_K || kQ5_K || kQ6_K || kQ8_0, "a type gemv_imma tiles");
  static constexpr int kUnitQ = kQ8_0 ? 1024 : 512;
  static constexpr int kGroupQ = kUnitsPerSlice * tiled_unit_quant_bytes(T);
  static constexpr int kGroupMeta = kUnitsPerSlice * tiled_unit_meta_bytes(T);
  static constexpr int kAWords = kQ8_0 ? 2 : 1;                // 16-byte A words a lane a row group
  static constexpr int kExtra = kQ5_K ? 4 : (kQ4_K ? 0 : 8);   // per-unit bytes a lane a row group
  static constexpr bool kDigitSums = kQ4_0 || kQ4_K || kQ5_K;  // the offset-8 term or the mins read D
  static constexpr bool kHeads = kQ4_K || kQ5_K || kQ6_K;      // per-super-block scales in the ring
  static constexpr int kHeadBytes = kQ6_K ? 36 : 32;           // a ring slot's bytes per (row group, g)
  // One warp's stage, structure of arrays by slot so that a warp's 16-, 8- and 4-byte reads hit distinct banks:
  // A quants [word][r][lane] 16 B, extras [r][lane] kExtra B, B digits [p][lane] 16 B, B digit sums [p][lane] 8 B
  // (room for kMaxSets sets; two digits use half of B's).
  static constexpr int kExtraOff = kAWords * kRG * 32 * 16;
  static constexpr int kBOff = kExtraOff + kRG * 32 * kExtra;
  static constexpr int kBSumOff = kBOff + kMaxSets * 32 * 16;
  static constexpr int kStageBytes = kBSumOff + (kDigitSums ? kMaxSets * 32 * 8 : 0);
  // The heads ring after the stages: two slots of [r][g] (Q6_K: 32 bytes of scales [r][g], then d [r][g] 4 bytes).
  static constexpr int kSlotBytes = kHeads ? kRG * 8 * kHeadBytes : 0;
  static constexpr int kWarpBytes = kStages * kStageBytes + 2 * kSlotBytes;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kWarps) * kWarpBytes;
  static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "two blocks an SM");
};

struct GemmArgs {
  const void* base;  // dense: the tiled matrix (segment s holds vectors 8s ..); table: the ImmaSegment table
  const uint8_t* xprep;
  float* y;
  int64_t y_stride;
  const int32_t* n_used;  // table: the segments in use (optional)
  uint32_t meta_off;      // bytes from a matrix's start to its scales
  int n_units;            // 64-column units a row (a multiple of 4)
  int n_rg;               // row groups
  int n_vec;              // dense: vectors
  int n_seg;              // segments (dense: ceil(n_vec / 8); table: the table's length)
  XLayout lay;
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// out[base + i] for a lane's i in [0, N), without indexing the array at run time (it stays in registers).
template <int N>
__device__ __forceinline__ int pick(const int (&v)[kImmaSegmentVectors], int base, int i) {
  int r = v[base];
#pragma unroll
  for (int j = 1; j < N; ++j) r = i == j ? v[base + j] : r;
  return r;
}

// A lane's sums for one row group and set, rows g and g + 8, in units of its second digit: acc the current
// super-block's (Q4_0, Q5_K, Q6_K, Q8_0: f32; Q4_K: int32 in isum), msum the mins times the digit sums (Q4_K, Q5_K),
// sum the super-blocks before, scaled.
struct Acc {
  float acc[2];
  int isum[2];
  int msum[2];
  float sum[2];
};

// One unit of one row group for every set: the staged A words (st: the stage, r: the row group), the unit's B
// fragments and digit sums, the row group's heads in the ring (hd: Q4_K, Q5_K rows g and g + 8's; Q6_K their
// scales), unit j of the super-block.
template <GgmlType T, int kNS>
__device__ __forceinline__ void multiply_unit(const uint8_t* st, int r, int lane, const uint4 (&fb)[kNS],
                                              const int2 (&dd)[kNS], const uint8_t* hd, int j, Acc (&c)[kNS]) {
  using L = Layout<T>;
  const uint4 q = *reinterpret_cast<const uint4*>(st + (r * 32 + lane) * 16);
  if constexpr (L::kQ4_0) {
    const uint2 d = *reinterpret_cast<const uint2*>(st + L::kExtraOff + (r * 32 + lane) * 8);
#pragma unroll
    for (int b = 0; b < 2; ++b) {              // the unit's two blocks
      const uint32_t pw = b == 0 ? q.x : q.z;  // row g
      const uint32_t qw = b == 0 ? q.y : q.w;  // row g + 8
      const uint32_t a0 = pw & kNibbles, a1 = qw & kNibbles, a2 = (pw >> 4) & kNibbles, a3 = (qw >> 4) & kNibbles;
      const uint32_t sc = b == 0 ? d.x : d.y;
      const float s_g = half_bits(sc & 0xFFFFu);
      const float s_g8 = half_bits(sc >> 16);
#pragma unroll
      for (int p = 0; p < kNS; ++p) {  // every set, even past n_vec: no branch between the MMAs
        int m[4];
        mma_u8s8(m, a0, a1, a2, a3, b == 0 ? fb[p].x : fb[p].z, b == 0 ? fb[p].y : fb[p].w, 0,
                 kMagic - 8 * (b == 0 ? dd[p].x : dd[p].y));
        c[p].acc[0] = __fmaf_rn(__int_as_float(m[0] * 128 + m[1]) - kMagicF, s_g, c[p].acc[0]);
        c[p].acc[1] = __fmaf_rn(__int_as_float(m[2] * 128 + m[3]) - kMagicF, s_g8, c[p].acc[1]);
      }
    }
  } else if constexpr (L::kQ4_K || L::kQ5_K) {
    // The unit's two sub-blocks (low nibbles: 2j, high: 2j + 1), each scale and min 6 bits of the unit's field.
    const uint4 hg = *reinterpret_cast<const uint4*>(hd);
    const uint4 hg8 = *reinterpret_cast<const uint4*>(hd + 16);
    const uint32_t f0 = k_field(hg, j);
    const uint32_t f8 = k_field(hg8, j);
    [[maybe_unused]] uint32_t qh = 0;
    if constexpr (L::kQ5_K) qh = *reinterpret_cast<const uint32_t*>(st + L::kExtraOff + (r * 32 + lane) * 4);
    [[maybe_unused]] int iu[kNS][2];  // Q5_K: the unit's sums (< 2^30)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int sh = 4 * b;
      uint32_t a0 = (q.x >> sh) & kNibbles, a1 = (q.y >> sh) & kNibbles, a2 = (q.z >> sh) & kNibbles,
               a3 = (q.w >> sh) & kNibbles;
      if constexpr (L::kQ5_K) {
        a0 |= q5_high(qh, 4 * b), a1 |= q5_high(qh, 4 * b + 1), a2 |= q5_high(qh, 4 * b + 2);
        a3 |= q5_high(qh, 4 * b + 3);
      }
      const int sc0 = static_cast<int>((f0 >> (6 * b)) & 63u), mn0 = static_cast<int>((f0 >> (12 + 6 * b)) & 63u);
      const int sc8 = static_cast<int>((f8 >> (6 * b)) & 63u), mn8 = static_cast<int>((f8 >> (12 + 6 * b)) & 63u);
#pragma unroll
      for (int p = 0; p < kNS; ++p) {
        int m[4];
        mma_u8s8(m, a0, a1, a2, a3, b == 0 ? fb[p].x : fb[p].z, b == 0 ? fb[p].y : fb[p].w, 0, 0);
        const int dsum = b == 0 ? dd[p].x : dd[p].y;
        // Q4_K: |128·m0 + m1| < 2^22, times sc < 64, over 8 sub-blocks: < 2^31. Q5_K: < 2^23 · 64 a sub-block.
        const int v0 = (m[0] * 128 + m[1]) * sc0, v8 = (m[2] * 128 + m[3]) * sc8;
        if constexpr (L::kQ4_K) {
          c[p].isum[0] += v0;
          c[p].isum[1] += v8;
        } else {
          iu[p][0] = b == 0 ? v0 : iu[p][0] + v0;
          iu[p][1] = b == 0 ? v8 : iu[p][1] + v8;
        }
        c[p].msum[0] += mn0 * dsum;
        c[p].msum[1] += mn8 * dsum;
      }
    }
    if constexpr (L::kQ5_K) {
#pragma unroll
      for (int p = 0; p < kNS; ++p) {
        c[p].acc[0] = __fadd_rn(c[p].acc[0], static_cast<float>(iu[p][0]));
        c[p].acc[1] = __fadd_rn(c[p].acc[1], static_cast<float>(iu[p][1]));
      }
    }
  } else if constexpr (L::kQ6_K) {
    // Sub-block s of the unit: low nibbles from word s / 2 of its row (s odd: the high nibbles), high bits from the
    // unit's qh word of the row; its scale byte j·4 + s of the row's 16 (|128·m0 + m1| · 128 < 2^29 + 2^22: two
    // sub-blocks stay below 2^31).
    const uint2 hb = *reinterpret_cast<const uint2*>(st + L::kExtraOff + (r * 32 + lane) * 8);
    const uint32_t scg = *reinterpret_cast<const uint32_t*>(hd + 4 * j);
    const uint32_t scg8 = *reinterpret_cast<const uint32_t*>(hd + 16 + 4 * j);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int iu[kNS][2];
#pragma unroll
      for (int s = 2 * half; s < 2 * half + 2; ++s) {
        const uint32_t a0 = q6_a(s < 2 ? q.x : q.z, hb.x, s);
        const uint32_t a1 = q6_a(s < 2 ? q.y : q.w, hb.y, s);
        const int k0 = sbyte(scg, s);
        const int k8 = sbyte(scg8, s);
#pragma unroll
        for (int p = 0; p < kNS; ++p) {
          int m[4];
          mma_s8s8_k16(m, a0, a1, word(fb[p], s));
          const int v0 = (m[0] * 128 + m[1]) * k0, v8 = (m[2] * 128 + m[3]) * k8;
          iu[p][0] = s == 2 * half ? v0 : iu[p][0] + v0;
          iu[p][1] = s == 2 * half ? v8 : iu[p][1] + v8;
        }
      }
#pragma unroll
      for (int p = 0; p < kNS; ++p) {
        c[p].acc[0] = __fadd_rn(c[p].acc[0], static_cast<float>(iu[p][0]));
        c[p].acc[1] = __fadd_rn(c[p].acc[1], static_cast<float>(iu[p][1]));
      }
    }
  } else {  // Q8_0: blocks 2u (q) and 2u + 1
    const uint4 q2 = *reinterpret_cast<const uint4*>(st + (kRG * 32 + r * 32 + lane) * 16);
    const uint2 d = *reinterpret_cast<const uint2*>(st + L::kExtraOff + (r * 32 + lane) * 8);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const uint32_t sc = b == 0 ? d.x : d.y;
      const float s_g = half_bits(sc & 0xFFFFu);
      const float s_g8 = half_bits(sc >> 16);
#pragma unroll
      for (int p = 0; p < kNS; ++p) {
        int m[4];
        mma_s8s8(m, b == 0 ? q : q2, b == 0 ? fb[p].x : fb[p].z, b == 0 ? fb[p].y : fb[p].w);
        c[p].acc[0] = __fmaf_rn(static_cast<float>(m[0] * 128 + m[1]), s_g, c[p].acc[0]);
        c[p].acc[1] = __fmaf_rn(static_cast<float>(m[2] * 128 + m[3]), s_g8, c[p].acc[1]);
      }
    }
  }
}

// A super-block's (a group's) end for one row group: its sums scaled by the rows' d (and dmin) and the group's
// activation scale per set, added to sum.
template <GgmlType T, int kNS>
__device__ __forceinline__ void end_group(const uint8_t* hd, const uint8_t* hd_d, const float (&xs)[kNS],
                                          Acc (&c)[kNS]) {
  using L = Layout<T>;
  [[maybe_unused]] float dg[2], dm[2];
  if constexpr (L::kQ4_K || L::kQ5_K) {
    const uint32_t d0 = *reinterpret_cast<const uint32_t*>(hd);
    const uint32_t d8 = *reinterpret_cast<const uint32_t*>(hd + 16);
    dg[0] = half_bits(d0 & 0xFFFFu), dm[0] = half_bits(d0 >> 16);
    dg[1] = half_bits(d8 & 0xFFFFu), dm[1] = half_bits(d8 >> 16);
  }
  if constexpr (L::kQ6_K) {
    const uint32_t d = *reinterpret_cast<const uint32_t*>(hd_d);
    dg[0] = half_bits(d & 0xFFFFu), dg[1] = half_bits(d >> 16);
  }
#pragma unroll
  for (int p = 0; p < kNS; ++p) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float v;
      if constexpr (L::kQ4_K) {
        v = __fmaf_rn(dg[i], static_cast<float>(c[p].isum[i]), -__fmul_rn(dm[i], static_cast<float>(c[p].msum[i])));
        c[p].isum[i] = c[p].msum[i] = 0;
      } else if constexpr (L::kQ5_K) {
        v = __fmaf_rn(dg[i], c[p].acc[i], -__fmul_rn(dm[i], static_cast<float>(c[p].msum[i])));
        c[p].acc[i] = 0.0f;
        c[p].msum[i] = 0;
      } else if constexpr (L::kQ6_K) {
        v = __fmul_rn(dg[i], c[p].acc[i]);
        c[p].acc[i] = 0.0f;
      } else {
        v = c[p].acc[i];
        c[p].acc[i] = 0.0f;
      }
      c[p].sum[i] = __fadd_rn(c[p].sum[i], __fmul_rn(xs[p], v));
    }
  }
}

// Grid: x = segment, y = tile of 256 rows; the blocks of one row tile are adjacent, so the tile's weights come from
// DRAM once and from L2 for the other segments.
template <bool kTable, int kDigits, GgmlType T>
__global__ void __launch_bounds__(kWarps * 32, 2) gemm_imma_kernel(GemmArgs a) {
  using S = Sets<kDigits>;
  using L = Layout<T>;
  constexpr int kNS = S::kCount;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int seg = static_cast<int>(blockIdx.x);
  const int rg0 = (static_cast<int>(blockIdx.y) * kWarps + warp) * kRG;
  int n_seg = a.n_seg;
  if constexpr (kTable) {
    if (a.n_used != nullptr) n_seg = min(n_seg, *a.n_used);
  }
  if (seg >= n_seg || rg0 >= a.n_rg) return;  // whole warps: nothing below synchronizes the block

  // The segment: its matrix, vectors and output rows (slots past n_vec repeat the last vector; not stored).
  const uint8_t* w;
  int n_vec;
  int vec[kImmaSegmentVectors];
  int out[kImmaSegmentVectors];
  if constexpr (kTable) {
    const ImmaSegment* e = static_cast<const ImmaSegment*>(a.base) + seg;
    w = static_cast<const uint8_t*>(e->data);
    n_vec = min(e->n_vec, kImmaSegmentVectors);
#pragma unroll
    for (int j = 0; j < kImmaSegmentVectors; ++j) {
      vec[j] = e->vec[min(j, max(n_vec - 1, 0))];
      out[j] = e->out[min(j, max(n_vec - 1, 0))];
    }
  } else {
    w = static_cast<const uint8_t*>(a.base);
    n_vec = min(kImmaSegmentVectors, a.n_vec - seg * kImmaSegmentVectors);
#pragma unroll
    for (int j = 0; j < kImmaSegmentVectors; ++j) vec[j] = out[j] = seg * kImmaSegmentVectors + min(j, n_vec - 1);
  }
  if (n_vec <= 0) return;

  // Per set p the lane's B vector and digit (column g) and its C vector and digit pair h (columns 2t, 2t + 1), as byte
  // offsets from xprep: digits of unit 0 (+ 256 a unit), digit sums of unit 0 (+ 16 a unit); a group's scale lies at
  // its digit-sum offset + sdelta + 4 per group.
  const uint32_t vb = static_cast<uint32_t>(a.lay.vec_bytes());
  const int h = t % S::kLanesPerVector;
  uint32_t xf[kNS];
  uint32_t xd[kNS];
#pragma unroll
  for (int p = 0; p < kNS; ++p) {
    const int vf = pick<S::kPerSet>(vec, p * S::kPerSet, g / kDigits);
    const int vd = pick<S::kPerSet>(vec, p * S::kPerSet, t / S::kLanesPerVector);
    xf[p] = static_cast<uint32_t>(vf) * vb + static_cast<uint32_t>((g % kDigits) * 4 + t) * 16;
    xd[p] = static_cast<uint32_t>(vd) * vb + static_cast<uint32_t>(a.lay.frag_bytes()) + h * 8;
  }
  const uint32_t sdelta = static_cast<uint32_t>(a.lay.dsum_bytes()) - h * 8;
  // The lane's words of super-block 0 per row group, as byte offsets from w (rows past the last group repeat it; not
  // stored): quants (+ kGroupQ a super-block), scales (+ kGroupMeta a super-block; Q4_0, Q8_0: row g's d's of unit 0,
  // + 64 a unit; Q4_K, Q5_K: row g's head, row g + 8's at + 128; Q6_K: row g's scales, row g + 8's at + 16, their d
  // at 256 + 4g from the super-block's start).
  uint32_t wq[kRG];
  uint32_t wm[kRG];
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
    const uint32_t sb0 = static_cast<uint32_t>(min(rg0 + r, a.n_rg - 1)) * static_cast<uint32_t>(a.n_units / 4);
    wq[r] = sb0 * L::kGroupQ + lane * 16;
    wm[r] = a.meta_off + sb0 * L::kGroupMeta + g * (L::kQ6_K ? 32 : (L::kHeads ? 16 : 8));
  }

  const uint32_t mine =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + static_cast<uint32_t>(warp * L::kWarpBytes);
  auto issue = [&](int u) {
    if (u < a.n_units) {
      const int j = u % kUnitsPerSlice;
      const uint32_t st = mine + static_cast<uint32_t>((u % kStages) * L::kStageBytes);
      const uint32_t sbq = static_cast<uint32_t>(u / kUnitsPerSlice) * L::kGroupQ;
      const uint8_t* wu = w + sbq + j * L::kUnitQ;
      const uint8_t* xu = a.xprep + static_cast<uint32_t>(u) * 256;
      const uint8_t* du = a.xprep + static_cast<uint32_t>(u) * 16;
#pragma unroll
      for (int r = 0; r < kRG; ++r) {
        cp_async16(st + (r * 32 + lane) * 16, wu + wq[r]);
        if constexpr (L::kAWords == 2) cp_async16(st + (kRG * 32 + r * 32 + lane) * 16, wu + 512 + wq[r]);
        const uint32_t ex = st + L::kExtraOff + (r * 32 + lane) * L::kExtra;
        if constexpr (L::kQ4_0 || L::kQ8_0) cp_async8(ex, w + static_cast<uint32_t>(u) * 64 + wm[r]);
        if constexpr (L::kQ5_K) cp_async4(ex, w + sbq + 2048 + wq[r] + 4 * j);
        if constexpr (L::kQ6_K) cp_async8(ex, w + sbq + 2048 + (j / 2) * 512 + wq[r] + (j % 2) * 8);
      }
      if constexpr (L::kHeads) {
        if (j == 0 && t < 3) {  // the super-block's heads for rows g and g + 8: lane t = 0 row g's, 1 row g + 8's
          const uint32_t slot =
              mine + static_cast<uint32_t>(kStages * L::kStageBytes + ((u / kUnitsPerSlice) % 2) * L::kSlotBytes);
          const uint8_t* mu = w + static_cast<uint32_t>(u / kUnitsPerSlice) * L::kGroupMeta;
#pragma unroll
          for (int r = 0; r < kRG; ++r) {
            if constexpr (L::kQ6_K) {
              if (t < 2) cp_async16(slot + (r * 8 + g) * 32 + 16 * t, mu + wm[r] + 16 * t);
              if (t == 2) cp_async4(slot + kRG * 8 * 32 + (r * 8 + g) * 4, mu + wm[r] + 256 - g * 28);
            } else if (t < 2) {
              cp_async16(slot + (r * 8 + g) * 32 + 16 * t, mu + wm[r] + 128 * t);
            }
          }
        }
      }
#pragma unroll
      for (int p = 0; p < kNS; ++p) {
        cp_async16(st + L::kBOff + (p * 32 + lane) * 16, xu + xf[p]);
        if constexpr (L::kDigitSums) cp_async8(st + L::kBSumOff + (p * 32 + lane) * 8, du + xd[p]);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count right
  };

  Acc c[kRG][kNS];
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
#pragma unroll
    for (int p = 0; p < kNS; ++p) {
      c[r][p].acc[0] = c[r][p].acc[1] = c[r][p].sum[0] = c[r][p].sum[1] = 0.0f;
      c[r][p].isum[0] = c[r][p].isum[1] = c[r][p].msum[0] = c[r][p].msum[1] = 0;
    }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  float xs[kNS];
  const uint8_t* smem_base = smem + warp * L::kWarpBytes;
  for (int u = 0; u < a.n_units; ++u) {
    issue(u + kStages - 1);
    const int j = u % kUnitsPerSlice;
    if (j == 0) {  // the group's scale per vector, used at its end
      const uint8_t* sg = a.xprep + sdelta + static_cast<uint32_t>(u / kUnitsPerSlice) * 4;
#pragma unroll
      for (int p = 0; p < kNS; ++p) xs[p] = *reinterpret_cast<const float*>(sg + xd[p]);
    }
    cp_async_wait<kStages - 1>();
    // The heads lanes t = 0..2 copied become visible to the other lanes of their g (and every lane is past the reads
    // of the slot the next super-block's copy overwrites).
    if constexpr (L::kHeads) {
      if (j == 0) __syncwarp();
    }
    const uint8_t* st = smem_base + (u % kStages) * L::kStageBytes;
    const uint8_t* slot = smem_base + kStages * L::kStageBytes + ((u / kUnitsPerSlice) % 2) * L::kSlotBytes;
    uint4 fb[kNS];
    int2 dd[kNS];
#pragma unroll
    for (int p = 0; p < kNS; ++p) {
      fb[p] = *reinterpret_cast<const uint4*>(st + L::kBOff + (p * 32 + lane) * 16);
      dd[p] = make_int2(0, 0);
      if constexpr (L::kDigitSums) dd[p] = *reinterpret_cast<const int2*>(st + L::kBSumOff + (p * 32 + lane) * 8);
    }
#pragma unroll
    for (int r = 0; r < kRG; ++r) multiply_unit<T, kNS>(st, r, lane, fb, dd, slot + (r * 8 + g) * 32, j, c[r]);
    if (j == kUnitsPerSlice - 1) {  // a group's end: its scale per vector
#pragma unroll
      for (int r = 0; r < kRG; ++r) {
        end_group<T, kNS>(slot + (r * 8 + g) * 32, slot + kRG * 8 * 32 + (r * 8 + g) * 4, xs, c[r]);
      }
    }
  }
  cp_async_wait<0>();

  // Four digits: a vector's digits joined over the lane pair t, t ^ 1, then lane t even stores; two digits: the sums
  // are in units of digit 1 (128^−1 of the group scale) and every lane stores its own vector. Rows g, g + 8.
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
#pragma unroll
    for (int p = 0; p < kNS; ++p) {
      float* sum = c[r][p].sum;
      if constexpr (kDigits == 4) {
        pair_sum(c[r][p].sum, lane);
      } else {
        sum[0] = __fmul_rn(sum[0], kDigitUnit0);
        sum[1] = __fmul_rn(sum[1], kDigitUnit0);
      }
      const int i = t / S::kLanesPerVector;
      const int o = pick<S::kPerSet>(out, p * S::kPerSet, i);
      if (h == 0 && p * S::kPerSet + i < n_vec && rg0 + r < a.n_rg) {
        float* yo = a.y + static_cast<int64_t>(o) * a.y_stride + static_cast<int64_t>(rg0 + r) * kTileRows;
        yo[g] = sum[0];
        yo[g + 8] = sum[1];
      }
    }
  }
}

bool aligned(const void* p, uintptr_t al) { return (reinterpret_cast<uintptr_t>(p) % al) == 0; }

GemmArgs base_args(GgmlType type, int64_t n_cols, int64_t n_rows, const void* xprep, float* y, int64_t y_stride) {
  GemmArgs a{};
  a.xprep = static_cast<const uint8_t*>(xprep);
  a.y = y;
  a.y_stride = y_stride;
  a.meta_off = static_cast<uint32_t>(tiled_meta_offset(type, n_cols, n_rows));
  a.n_units = static_cast<int>(n_cols / kUnitElems);
  a.n_rg = static_cast<int>(n_rows / kTileRows);
  a.lay = x_layout(n_cols);
  return a;
}

template <bool kTable, int kDigits, GgmlType T>
Status launch_kernel(const GemmArgs& a, cudaStream_t stream) {
  constexpr auto kernel = gemm_imma_kernel<kTable, kDigits, T>;
  KESTREL_TRY(check_smem<kernel>(Layout<T>::kSmemBytes, "gemm_imma: its operand stages"));
  const dim3 grid(static_cast<unsigned>(a.n_seg),
                  static_cast<unsigned>((a.n_rg + kTileRowGroups - 1) / kTileRowGroups));
  kernel<<<grid, kWarps * 32, Layout<T>::kSmemBytes, stream>>>(a);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

template <bool kTable, GgmlType T>
Status launch_type(const GemmArgs& a, GemmDigits digits, cudaStream_t stream) {
  return digits == GemmDigits::kTwo ? launch_kernel<kTable, 2, T>(a, stream) : launch_kernel<kTable, 4, T>(a, stream);
}

template <bool kTable>
Status launch(const GemmArgs& a, GgmlType type, GemmDigits digits, cudaStream_t stream) {
  switch (type) {
    case GgmlType::kQ4_K: return launch_type<kTable, GgmlType::kQ4_K>(a, digits, stream);
    case GgmlType::kQ5_K: return launch_type<kTable, GgmlType::kQ5_K>(a, digits, stream);
    case GgmlType::kQ6_K: return launch_type<kTable, GgmlType::kQ6_K>(a, digits, stream);
    case GgmlType::kQ8_0: return launch_type<kTable, GgmlType::kQ8_0>(a, digits, stream);
    default: return launch_type<kTable, GgmlType::kQ4_0>(a, digits, stream);  // gemm_imma_supports checked the type
  }
}

Status bad_digits(const char* what, GemmDigits digits) {
  return make_error(ErrorCode::kInvalidArgument,
                    std::string(what) + ": digits " + std::to_string(static_cast<int>(digits)) + " (4 or 2)");
}

std::string shape_text(GgmlType type, int64_t n_cols, int64_t n_rows) {
  return std::string(ggml_type_name(type)) + " {" + std::to_string(n_cols) + ", " + std::to_string(n_rows) + "}";
}

}  // namespace

bool gemm_imma_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  const bool typed = type == GgmlType::kQ4_0 || type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ||
                     type == GgmlType::kQ6_K || type == GgmlType::kQ8_0;
  return typed && n_cols % (kUnitElems * kUnitsPerSlice) == 0 && gemv_imma_supports(type, n_cols, n_rows);
}

Status gemm_imma(const TiledView& w, const void* xprep, int n_vec, float* y, cudaStream_t stream, GemmDigits digits) {
  if (!gemm_digits_valid(digits)) return bad_digits("gemm_imma", digits);
  if (!gemm_imma_supports(w.type, w.n_cols, w.n_rows)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemm_imma: " + shape_text(w.type, w.n_cols, w.n_rows) + " is not a shape it takes");
  }
  if (n_vec < 1 || imma_x_bytes(w.n_cols, n_vec) == 0) {
    return make_error(ErrorCode::kInvalidArgument, "gemm_imma: n_vec " + std::to_string(n_vec) + " out of range");
  }
  KESTREL_TRY(imma_dense_pointers_check("gemm_imma", w, xprep, n_vec, y));
  GemmArgs a = base_args(w.type, w.n_cols, w.n_rows, xprep, y, w.n_rows);
  a.base = w.data;
  a.n_vec = n_vec;
  a.n_seg = (n_vec + kImmaSegmentVectors - 1) / kImmaSegmentVectors;
  return launch<false>(a, w.type, digits, stream);
}

Status gemm_imma_segments(GgmlType type, int64_t n_cols, int64_t n_rows, const ImmaSegment* segments, int n_segments,
                          const void* xprep, float* y, int64_t y_stride, cudaStream_t stream, const int32_t* n_used,
                          GemmDigits digits) {
  if (!gemm_digits_valid(digits)) return bad_digits("gemm_imma_segments", digits);
  if (!gemm_imma_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemm_imma_segments: " + shape_text(type, n_cols, n_rows) + " is not a shape it takes");
  }
  if (n_segments < 0 || (n_segments > 0 && segments == nullptr) || xprep == nullptr || y == nullptr ||
      !aligned(xprep, 16) || !aligned(y, 4) || y_stride < n_rows) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemm_imma_segments: bad table, pointer (xprep 16-byte aligned, y 4) or y_stride " +
                          std::to_string(y_stride) + " < n_rows " + std::to_string(n_rows));
  }
  if (n_segments == 0) return ok_status();
  GemmArgs a = base_args(type, n_cols, n_rows, xprep, y, y_stride);
  a.base = segments;
  a.n_used = n_used;
  a.n_seg = n_segments;
  return launch<true>(a, type, digits, stream);
}

}  // namespace kestrel::gpu
