// AVX-512 VNNI GEMV kernels for the block-quantized weight types on int8 activations (act_q8.h): Q4_0, Q8_0,
// Q4_K, Q5_K, Q6_K. Included only by gemv_avx512.cpp, after gemv_simd.h (whose half_at it uses), so it is compiled
// with that file's flags (AVX-512 F/BW/VL/VNNI, -ffp-contract=off).
//
// Why int8 and not f32 FMA — measured on the 2-core AVX-512 development VM (AMD Zen 5), one thread, thread CPU
// time, rows in L2: decoding a Q4_0 weight to f32 costs a widening, a conversion and a scale multiply per 16
// weights before the FMA, 12.5 GB/s of weights from L2, well under the 17 GB/s one core reads from DRAM; here 64
// weights become one register of unsigned bytes with three integer ops and one vpdpbusd multiplies them by 64 int8
// activations, 23.5 GB/s in the same loop. On the lent hosts (Xeon, 512-bit work on ports 0 and 5 only) every core
// busy at once computes about as fast as the memory reads, so instructions per weight byte set the ratio to the read:
// llvm-mca's icelake-server model puts the 4-row tiles at 10.9 weight bytes a cycle for Q4_0 (the quads below) and
// 7.3 for Q4_K (dev/notes/cpu-gemv.md). The cost is numerical: activations rounded to 1/254 of their block's
// largest value (CpuActivations::kF32 keeps the f32 kernels; tests/cpu/test_cpu_blocks states the tolerance).
//
// Per 64 weights and (row, vector) pair: p = vpdpbusd(c·ns4, u, q) — u the weights as unsigned bytes (value + c),
// q the activations, p one exact int32 per 4 elements — then acc += float(p) · (weight scale · activation scale),
// one scale per 8-lane block (Q4_0/Q8_0) or sub-block (Q4_K/Q5_K), or 4-lane group (Q6_K). Q4_K/Q5_K's mins enter
// once per super-block: acc −= dmin·m_j · ds_j over the 8 sub-blocks. The integer part is exact, so a result
// differs from ref::matvec_batch(W, x̃) (x̃ the dequantized activations) by f32 rounding only. Q4_0's units go by
// quads of blocks instead (FmtQ4_0): two vpdpbusd into one int32 lane per 8 elements of one block, so one conversion
// and one FMA per 128 weights and row. Q4_0/Q8_0 read the f16 scales of 8 (4) blocks with one word permute
// (block_scales) rather than one broadcast per block.
//
// Tiles: R rows (4, or 1 for the rest; 8 for Q4_0 / Q4_K rows of at most 512 bytes at one vector) × V vectors (1..3);
// each (row, vector) accumulator sees the same operations in the same order whatever R and V are, and the 16 lanes are
// reduced in a fixed order (hsum16) at the end of the row, so a row's result does not depend on the batch or on how
// rows are split. Each tile prefetches the next tile's rows at the same offset (rows are short: the hardware prefetcher
// alone left Q4_0 at 0.4 of the read).
#pragma once

#ifndef KESTREL_GEMV_NS
#error "include cpu/gemv_simd.h (with KESTREL_GEMV_NS) before cpu/gemv_q8_avx512.h"
#endif
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "cpu/gemv_q8_avx512.h needs -mavx512f -mavx512bw -mavx512vnni"
#endif

#include <immintrin.h>

#include <cstring>

#include "core/quant/blocks.h"
#include "cpu/act_q8.h"
#include "cpu/gemv.h"
#include "cpu/simd_f32.h"

// The small loops over a tile's rows, vectors and chunks must unroll fully (KESTREL_SIMD_UNROLL, simd_f32.h), and a
// format's unit / pair / tail must inline into the tile, so that the accumulator and weight arrays live in registers
// (GCC's -O2 keeps them on the stack otherwise, or passes them to an out-of-line unit through memory, and every FMA
// waits on a store and a load).
#define KESTREL_INLINE __attribute__((always_inline)) inline

namespace kestrel::cpu::KESTREL_GEMV_NS {

// One vector's quantized activations.
struct Q8Vec {
  const int8_t* q;
  const float* dl;
  const int32_t* ns4;
  const float* ds;
  const float* d;     // one scale per block of 32
  const int32_t* nq;  // FmtQ4_0's offset term per lane (act_q8.h)
};

inline uint16_t u16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// [half a ×8 | half b ×8] as f32: two word broadcasts and one conversion.
inline __m512 halves_ps(const uint8_t* a, const uint8_t* b) {
  const __m256i h = _mm256_mask_set1_epi16(_mm256_set1_epi16(static_cast<int16_t>(u16_at(a))), 0xFF00,
                                           static_cast<int16_t>(u16_at(b)));
  return _mm512_cvtph_ps(h);
}

// Lane i ← table[first + i / kGroup] for a 16-entry table (the scale of each lane's sub-block or group).
template <int kGroup>
inline __m512 lane_scales(__m512 table, int first) {
  static_assert(kGroup == 4 || kGroup == 8);
  const __m512i step = kGroup == 8 ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
                                   : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(_mm512_add_epi32(step, _mm512_set1_epi32(first)), table);
}

// The sum of the 16 lanes in a fixed order (simd_f32.h: lanes 0..7 + lanes 8..15, then the 8-lane order).
inline float hsum16(__m512 v) { return simd::F32x16::hsum(v); }

// acc += float(vpdpbusd(corr, u, q)) · (ws · dl): one (row, vector) pair over 64 elements.
inline __m512 dot64(__m512 acc, __m512i u, __m512i q, __m512i corr, __m512 ws, __m512 dl) {
  const __m512i p = _mm512_dpbusd_epi32(corr, u, q);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ws, dl), acc);
}

// acc += float(vpdpbusd(corr, u, q)) · s, s = ws · dl formed beforehand: the same value as dot64's.
inline __m512 dot64_scaled(__m512 acc, __m512i u, __m512i q, __m512i corr, __m512 s) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr, u, q)), s, acc);
}

// The activation's scales of kN consecutive blocks from block b in lanes 0..kN−1 (zero above).
template <int kN>
inline __m512 act_block_scales(const float* d, int64_t b) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << kN) - 1), d + b);
}

// Vector v's products over one chunk of 64 elements for R rows: acc[r][v] += float(vpdpbusd(corr, u[r], q)) · s_r,
// with s_r = ws[r] when kScaled (one vector: the unit's scales already hold the activation's, multiplied once per
// unit) and ws[r] · dl otherwise (dl: the vector's lane scales at dl_lanes, lanes outside kl zero).
template <bool kScaled, int R, int V>
KESTREL_INLINE void dot_chunk(const __m512i (&u)[R], const __m512 (&ws)[R], __m512i q, __m512i corr,
                              const float* dl_lanes, __mmask16 kl, int v, __m512 (&acc)[R][V]) {
  if constexpr (kScaled) {
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) acc[r][v] = dot64_scaled(acc[r][v], u[r], q, corr, ws[r]);
  } else {
    const __m512 dl = _mm512_maskz_loadu_ps(kl, dl_lanes);
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) acc[r][v] = dot64(acc[r][v], u[r], q, corr, ws[r], dl);
  }
}

inline constexpr uint8_t kZeroHalf[2] = {0, 0};

// The f16 scales of n consecutive blocks of kStride bytes at p (the scale first in each block; all within
// p[0..128)), as f32 in lanes 0..n−1: two loads, one word permute, one conversion for n blocks.
template <int kStride, int kN>
inline __m512 block_scales(const uint8_t* p) {
  static_assert(kStride % 2 == 0 && (kN - 1) * kStride < 128 && kN <= 16);
  alignas(64) static constexpr int16_t kIdx[32] = {
      0 * kStride / 2,        1 * kStride / 2,        2 * kStride / 2,        3 * kStride / 2,
      (4 % kN) * kStride / 2, (5 % kN) * kStride / 2, (6 % kN) * kStride / 2, (7 % kN) * kStride / 2};
  const __m512i lo = _mm512_loadu_si512(p);
  const __m512i hi = _mm512_loadu_si512(p + 64);
  const __m512i words = _mm512_permutex2var_epi16(lo, _mm512_load_si512(kIdx), hi);
  return _mm512_cvtph_ps(_mm512_castsi512_si256(words));
}

// Q4_0 and Q8_0 (32-element blocks of one f16 scale). Q8_0's unit is 4 blocks, whose scales one block_scales call
// reads, taken two at a time (64 elements, one register of weights); a row's last blocks that do not fill a unit go
// by pairs and a single (tail), Q4_0's too (FmtQ4_0 takes its whole units).
template <bool kQ8>
struct FmtBlock32 {
  static constexpr int64_t kBlockElems = 32;
  static constexpr uint64_t kBlockBytes = kQ8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  static constexpr int kGroup = 4;
  static constexpr int64_t kUnit = kGroup * 32;
  static constexpr int kOffsetShift = kQ8 ? 7 : 3;  // weights enter as unsigned w + 128 (Q8_0) or nibble = w + 8
  static constexpr bool kShortRowTile8 = false;

  // Blocks A and B (B absent: zero lanes) as 64 unsigned weight bytes: elements 0..31 of A, then of B.
  template <bool kPair>
  static __m512i weights(const uint8_t* A) {
    const uint8_t* B = A + kBlockBytes;
    if constexpr (kQ8) {
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A + 2));
      const __m512i z = kPair ? _mm512_inserti64x4(_mm512_castsi256_si512(qa),
                                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B + 2)), 1)
                              : _mm512_zextsi256_si512(qa);
      return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));
    } else {
      // [qs A | qs A | qs B | qs B] by two broadcast loads (no shuffle), then per 128-bit lane the 16-bit shift that
      // brings its nibbles down: [A lo, A hi, B lo, B hi].
      const __m512i shifts =
          _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0);
      const __m512i qa = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(A + 2)));
      const __m512i w =
          kPair ? _mm512_mask_broadcast_i32x4(qa, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(B + 2)))
                : _mm512_maskz_mov_epi32(0x00FF, qa);
      return _mm512_and_si512(_mm512_srlv_epi16(w, shifts), _mm512_set1_epi8(0x0F));
    }
  }

  // One pair (or a single block) at element `base` for every (row, vector), given each row's weights and scales
  // (kScaled: scales that already hold the activation's, dot_chunk).
  template <int R, int V, bool kPair, bool kScaled = false>
  KESTREL_INLINE static void pair(const __m512i (&u)[R], const __m512 (&ws)[R], int64_t base, const Q8Vec* x,
                                  __m512 (&acc)[R][V]) {
    const __mmask64 kq = kPair ? ~0ull : 0xFFFFFFFFull;
    const __mmask16 kl = kPair ? 0xFFFF : 0x00FF;
    KESTREL_SIMD_UNROLL
    for (int v = 0; v < V; ++v) {
      const __m512i q = _mm512_maskz_loadu_epi8(kq, x[v].q + base);
      const __m512i ns4 = _mm512_maskz_loadu_epi32(kl, x[v].ns4 + base / 4);
      const __m512i corr = _mm512_slli_epi32(ns4, kOffsetShift);
      dot_chunk<kScaled>(u, ws, q, corr, x[v].dl + base / 4, kl, v, acc);
    }
  }

  template <int R, int V>
  KESTREL_INLINE static void unit(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m512 (&acc)[R][V]) {
    static_assert(kQ8, "Q4_0's units are FmtQ4_0's");
    const uint64_t off = static_cast<uint64_t>(base / 32) * kBlockBytes;
    __m512 scales[R];
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) scales[r] = block_scales<kBlockBytes, kGroup>(row[r] + off);
    if constexpr (V == 1) {
      // One vector: the weight scales times the activation's, once per unit (ws · dl per block, the same products
      // pair() forms per pair of blocks otherwise).
      const __m512 d = act_block_scales<kGroup>(x[0].d, base / 32);
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) scales[r] = _mm512_mul_ps(scales[r], d);
    }
    KESTREL_SIMD_UNROLL
    for (int k = 0; k < kGroup / 2; ++k) {
      __m512i u[R];
      __m512 ws[R];
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        u[r] = weights<true>(row[r] + off + 2 * static_cast<uint64_t>(k) * kBlockBytes);
        ws[r] = lane_scales<8>(scales[r], 2 * k);
      }
      pair<R, V, true, V == 1>(u, ws, base + 64 * k, x, acc);
    }
  }

  // The last n_in − base (< kUnit) elements: pairs, then a single block.
  template <int R, int V>
  KESTREL_INLINE static void tail(const uint8_t* const* row, int64_t base, int64_t n_in, const Q8Vec* x,
                                  __m512 (&acc)[R][V]) {
    __m512i u[R];
    __m512 ws[R];
    for (; base + 64 <= n_in; base += 64) {
      const uint64_t off = static_cast<uint64_t>(base / 32) * kBlockBytes;
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        u[r] = weights<true>(row[r] + off);
        ws[r] = halves_ps(row[r] + off, row[r] + off + kBlockBytes);
      }
      pair<R, V, true>(u, ws, base, x, acc);
    }
    if (base < n_in) {
      const uint64_t off = static_cast<uint64_t>(base / 32) * kBlockBytes;
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        u[r] = weights<false>(row[r] + off);
        ws[r] = halves_ps(row[r] + off, kZeroHalf);
      }
      pair<R, V, false>(u, ws, base, x, acc);
    }
  }
};

using FmtQ8_0 = FmtBlock32<true>;

// Q4_0 in units of 8 blocks (256 elements), each taken as two quads of 4 blocks. A quad's 64 quant bytes form one
// register w = [qs A | qs B | qs C | qs D]; w & 15 holds the blocks' elements 0..15 and (w >> 4) & 15 their elements
// 16..31 (a Q4_0 byte's low nibble is element j, its high nibble element 16 + j), each multiplied by the activations
// re-laid the same way (two 128-bit lane shuffles of the vector's 128 quants), both into one int32 lane per 4 + 4
// elements of one block. Per quad and row that is one permute for the weights, three integer ops, two vpdpbusd, one
// conversion and one FMA: a scale permute per quad (lanes 4i..4i+3 ← block i's scale), none per element.
struct FmtQ4_0 {
  using Pairs = FmtBlock32<false>;  // a row's last blocks that do not fill a unit: pairs, then a single block
  static constexpr int64_t kBlockElems = 32;
  static constexpr uint64_t kBlockBytes = sizeof(BlockQ4_0);
  static constexpr int64_t kUnit = 256;
  static constexpr bool kShortRowTile8 = true;

  // The quad of blocks at p (72 bytes) as [qs A | qs B | qs C | qs D], by four 16-byte loads: two 64-byte loads and
  // a dword permute take fewer instructions, but every such load splits across two cache lines here (blocks of 18
  // bytes), which slowed the GEMV streaming from DRAM (dev/notes/cpu-gemv.md).
  static __m512i quad_weights(const uint8_t* p) {
    __m512i w = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)));
    w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 20)), 1);
    w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 38)), 2);
    return _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 56)), 3);
  }

  // Lanes 4i..4i+3 ← lane 4q + i of an 8-lane table (block 4q + i's scale).
  static __m512 quad_scales(__m512 table, int q) {
    const __m512i idx =
        _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), _mm512_set1_epi32(4 * q));
    return _mm512_permutexvar_ps(idx, table);
  }

  // One vector's side of a quad at element e: its quants as the weights' nibbles pair with them, and the offset
  // term of each lane (act_q8.h's nq).
  struct QuadX {
    __m512i lo, hi, corr;
  };
  static QuadX quad_x(const Q8Vec& x, int64_t e) {
    const __m512i q0 = _mm512_loadu_si512(x.q + e);       // [A 0..15 | A 16..31 | B 0..15 | B 16..31]
    const __m512i q1 = _mm512_loadu_si512(x.q + e + 64);  // the same for C, D
    return {_mm512_shuffle_i64x2(q0, q1, 0x88), _mm512_shuffle_i64x2(q0, q1, 0xDD), _mm512_loadu_si512(x.nq + e / 8)};
  }

  template <int R, int V>
  KESTREL_INLINE static void unit(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m512 (&acc)[R][V]) {
    const uint64_t off = static_cast<uint64_t>(base / 32) * kBlockBytes;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 scales[R];
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) scales[r] = block_scales<kBlockBytes, 8>(row[r] + off);
    __m512 dx[V];  // the activations' 8 block scales
    KESTREL_SIMD_UNROLL
    for (int v = 0; v < V; ++v) dx[v] = act_block_scales<8>(x[v].d, base / 32);
    if constexpr (V == 1) {
      // One vector: the weight scales times the activation's once per unit (the same products as per quad below).
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) scales[r] = _mm512_mul_ps(scales[r], dx[0]);
    }
    KESTREL_SIMD_UNROLL
    for (int q = 0; q < 2; ++q) {
      QuadX xq[V];
      KESTREL_SIMD_UNROLL
      for (int v = 0; v < V; ++v) xq[v] = quad_x(x[v], base + 128 * q);
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512i w = quad_weights(row[r] + off + 4 * kBlockBytes * static_cast<uint64_t>(q));
        const __m512i lo = _mm512_and_si512(w, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
        const __m512 ws = quad_scales(scales[r], q);
        KESTREL_SIMD_UNROLL
        for (int v = 0; v < V; ++v) {
          const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xq[v].corr, lo, xq[v].lo), hi, xq[v].hi);
          const __m512 s = V == 1 ? ws : _mm512_mul_ps(ws, quad_scales(dx[v], q));
          acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][v]);
        }
      }
    }
  }

  template <int R, int V>
  KESTREL_INLINE static void tail(const uint8_t* const* row, int64_t base, int64_t n_in, const Q8Vec* x,
                                  __m512 (&acc)[R][V]) {
    Pairs::tail<R, V>(row, base, n_in, x, acc);
  }
};

// d·sc_j in lanes 0..7 and dmin·m_j in lanes 8..15 of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4 for
// j = 0..7, times the block's d and dmin) from its first 16 bytes, in vector lanes: with packed bytes b[0..11],
//   sc_j = b[j] & 63,  m_j = b[j + 4] & 63                                  (j < 4)
//   sc_j = (b[j + 4] & 15) | (b[j − 4] >> 6) << 4,  m_j = (b[j + 4] >> 4) | (b[j] >> 6) << 4   (j >= 4)
// Two byte shuffles bring each lane's low and high sources into place; no scalar words pass through memory.
inline __m512 k4_scales_mins(const uint8_t* blk) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));  // b[0..11] and 4 bytes of qs
  // Low sources: sc 0..3 ← b[0..3], sc 4..7 ← b[8..11], m 0..3 ← b[4..7], m 4..7 ← b[8..11] (high nibbles).
  const __m128i lo = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  // High sources (bits 6, 7): sc 4..7 ← b[0..3], m 4..7 ← b[4..7]; other lanes are masked below.
  const __m128i hi = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7));
  const __m128i lo_nib = _mm_mask_blend_epi8(0xF000, lo, _mm_srli_epi16(lo, 4));
  const __m128i lo_bits =
      _mm_and_si128(lo_nib, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  const __m128i hi_bits = _mm_and_si128(
      _mm_srli_epi16(hi, 2), _mm_setr_epi8(0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30));
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_or_si128(lo_bits, hi_bits)));
  return _mm512_mul_ps(halves_ps(blk, blk + 2), v);
}

// Q4_K and Q5_K: a unit is a super-block of 256 (four chunks of 64 = sub-blocks 2c and 2c + 1).
template <bool kFive>
struct FmtK45 {
  static constexpr int64_t kUnit = 256;
  static constexpr int64_t kBlockElems = 256;
  static constexpr uint64_t kBlockBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static constexpr bool kShortRowTile8 = !kFive;  // gemv_q8's 8-row tiles for short rows: Q4_K

  template <int R, int V>
  KESTREL_INLINE static void unit(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m512 (&acc)[R][V]) {
    const uint64_t sb = static_cast<uint64_t>(base / 256);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i sixteen = _mm512_set1_epi8(16);
    const __m512i hi_half_by_4 =
        _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0x0004000400040004, 0x0004000400040004, 0, 0, 0, 0);
    const int64_t lo = 0x0F0F0F0F0F0F0F0F, hi = static_cast<int64_t>(0xF0F0F0F0F0F0F0F0ull);
    const __m512i nibbles = _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo);  // Q4_K: each half's nibbles in place
    const uint8_t* blk[R];
    __m512 dsc[R], dmn[R];  // d·sc_j and dmin·m_j in lanes 0..7 (zero above)
    __m512i qh[R];          // Q5_K: the 32 high-bit bytes in both halves
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      blk[r] = row[r] + sb * kBlockBytes;
      const __m512 both = k4_scales_mins(blk[r]);
      dsc[r] = _mm512_maskz_mov_ps(0x00FF, both);
      // One vector: d·sc_j times the activation's scale of sub-block j, once per super-block (the products dot64
      // forms per pair of sub-blocks otherwise).
      if constexpr (V == 1) dsc[r] = _mm512_mul_ps(dsc[r], act_block_scales<8>(x[0].d, base / 32));
      // Q4_K: the odd sub-blocks' quants stay in the high nibbles (16× their value), their scales / 16 (below).
      if constexpr (!kFive) dsc[r] = _mm512_mask_mul_ps(dsc[r], 0xAA, dsc[r], _mm512_set1_ps(0.0625f));
      dmn[r] = _mm512_zextps256_ps512(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(both), 1)));
      if constexpr (kFive) {
        qh[r] = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 16)));
      }
    }
    const uint64_t qs_off = kFive ? 48 : 16;
    KESTREL_SIMD_UNROLL
    for (int c = 0; c < 4; ++c) {
      __m512i u[R];
      __m512 ws[R];
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        // [qs | qs] by a broadcast load; the low half keeps the low nibbles (sub-block 2c), the high half the high:
        // shifted down (Q5_K, whose fifth bit joins them) or left in place, 16× (Q4_K: one AND, and the scale / 16
        // gives the same products: float(16p) · s/16 = float(p) · s exactly, powers of two).
        const __m512i y =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + qs_off + 32 * c)));
        __m512i z = kFive ? _mm512_and_si512(_mm512_srlv_epi16(y, hi_half_by_4), m4) : _mm512_and_si512(y, nibbles);
        if constexpr (kFive) {
          // Bit 2c of qh[l] is bit 4 of element 64c + l, bit 2c + 1 that of element 64c + 32 + l.
          const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                                  _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1))), 1);
          z = _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(qh[r], bits), z, sixteen);
        }
        u[r] = z;
        ws[r] = lane_scales<8>(dsc[r], 2 * c);
      }
      KESTREL_SIMD_UNROLL
      for (int v = 0; v < V; ++v) {
        const int64_t e = base + 64 * c;
        const __m512i q = _mm512_loadu_si512(x[v].q + e);
        dot_chunk<V == 1>(u, ws, q, _mm512_setzero_si512(), x[v].dl + e / 4, 0xFFFF, v, acc);
      }
    }
    KESTREL_SIMD_UNROLL
    for (int v = 0; v < V; ++v) {
      const __m512 ds = _mm512_zextps256_ps512(_mm256_loadu_ps(x[v].ds + base / 32));
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) acc[r][v] = _mm512_fnmadd_ps(dmn[r], ds, acc[r][v]);
    }
  }
};

// Q6_K: a unit is a super-block of 256 in two halves of 128; quants 0..63 enter unsigned, offset 32.
struct FmtQ6_K {
  static constexpr int64_t kUnit = 256;
  static constexpr int64_t kBlockElems = 256;
  static constexpr uint64_t kBlockBytes = sizeof(BlockQ6_K);
  static constexpr bool kShortRowTile8 = false;

  template <int R, int V>
  KESTREL_INLINE static void unit(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m512 (&acc)[R][V]) {
    const uint64_t sb = static_cast<uint64_t>(base / 256);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m2 = _mm512_set1_epi8(0x03);
    const uint8_t* blk[R];
    __m512 dsc[R];  // d·sc_g for the 16 groups of 16
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      blk[r] = row[r] + sb * kBlockBytes;
      const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + 192)));
      dsc[r] = _mm512_mul_ps(_mm512_set1_ps(half_at(blk[r] + 208)), _mm512_cvtepi32_ps(sc));
    }
    if constexpr (V == 1) {
      // One vector: each group's d·sc_g times the activation's scale of its block of 32 (groups 2b and 2b + 1), once
      // per super-block (the products dot64 forms per chunk otherwise).
      const __m512 d8 = act_block_scales<8>(x[0].d, base / 32);
      const __m512 d16 = _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), d8);
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) dsc[r] = _mm512_mul_ps(dsc[r], d16);
    }
    KESTREL_SIMD_UNROLL
    for (int h = 0; h < 2; ++h) {
      __m512i ua[R], ub[R];
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        // ql[64h + l] for l < 64; qh[32h + l] for l < 32 in the low half, shifted right by 2 in the high half.
        const __m512i L = _mm512_loadu_si512(blk[r] + 64 * h);
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 128 + 32 * h));
        const __m512i H = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
        // Elements 128h + 0..63: low nibbles | bits (0,1) / (2,3) of qh; 128h + 64..127: high nibbles | (4,5) / (6,7).
        ua[r] = _mm512_or_si512(_mm512_and_si512(L, m4), _mm512_slli_epi16(_mm512_and_si512(H, m2), 4));
        ub[r] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(H, 4), m2), 4));
      }
      KESTREL_SIMD_UNROLL
      for (int k = 0; k < 2; ++k) {
        const int chunk = 2 * h + k;  // elements 64·chunk .. 64·chunk + 63 of the super-block
        __m512 ws[R];
        KESTREL_SIMD_UNROLL
        for (int r = 0; r < R; ++r) ws[r] = lane_scales<4>(dsc[r], 4 * chunk);
        KESTREL_SIMD_UNROLL
        for (int v = 0; v < V; ++v) {
          const int64_t e = base + 64 * chunk;
          const __m512i q = _mm512_loadu_si512(x[v].q + e);
          const __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(x[v].ns4 + e / 4), 5);
          dot_chunk<V == 1>(k == 0 ? ua : ub, ws, q, corr, x[v].dl + e / 4, 0xFFFF, v, acc);
        }
      }
    }
  }
};

// R rows from row o × V vectors from v0.
template <class Fmt, int R, int V>
void q8_tile(const GemvTask& t, int64_t o, int64_t v0) {
  const uint8_t* row[R];
  KESTREL_SIMD_UNROLL
  for (int r = 0; r < R; ++r) row[r] = t.w + static_cast<uint64_t>(o + r) * t.row_bytes;
  Q8Vec x[V];
  KESTREL_SIMD_UNROLL
  for (int v = 0; v < V; ++v) {
    const int64_t vv = gemv_x_row(t, v0 + v);
    x[v] = Q8Vec{t.xq.q + vv * t.n_in,         t.xq.dl + vv * (t.n_in / 4), t.xq.ns4 + vv * (t.n_in / 4),
                 t.xq.ds + vv * (t.n_in / 32), t.xq.d + vv * (t.n_in / 32), t.xq.nq + vv * (t.n_in / 8)};
  }
  __m512 acc[R][V];
  KESTREL_SIMD_UNROLL
  for (int r = 0; r < R; ++r) {
    KESTREL_SIMD_UNROLL
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  // The rows of the tile R rows on, at the same offset: rows are contiguous, so this runs one tile ahead of the
  // reads through the item's bytes (short rows of a few cache lines each defeat the hardware prefetcher).
  const uint64_t ahead = static_cast<uint64_t>(R) * t.row_bytes;
  const uint64_t unit_bytes = static_cast<uint64_t>(Fmt::kUnit / Fmt::kBlockElems) * Fmt::kBlockBytes;
  int64_t base = 0;
  for (; base + Fmt::kUnit <= t.n_in; base += Fmt::kUnit) {
    const uint64_t off = static_cast<uint64_t>(base / Fmt::kBlockElems) * Fmt::kBlockBytes;
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      for (uint64_t b = 0; b < unit_bytes; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(row[r] + off + ahead + b), _MM_HINT_T0);
      }
    }
    Fmt::template unit<R, V>(row, base, x, acc);
  }
  if constexpr (requires { Fmt::template tail<R, V>(row, base, t.n_in, x, acc); }) {
    if (base < t.n_in) Fmt::template tail<R, V>(row, base, t.n_in, x, acc);  // Q4_0/Q8_0 rows of odd length
  }
  KESTREL_SIMD_UNROLL
  for (int r = 0; r < R; ++r) {
    KESTREL_SIMD_UNROLL
    for (int v = 0; v < V; ++v) t.y[(v0 + v) * t.n_out + o + r] = hsum16(acc[r][v]);
  }
}

// The vectors in tiles of 3 (4 as 2 + 2): a 4×4 tile's 16 accumulators and its rows' weights and scales do not fit
// the 32 registers, and its spills cost more than a 4×3 tile's extra weight decodes.
template <class Fmt, int R>
void q8_rows(const GemvTask& t, int64_t o) {
  int64_t v0 = 0;
  while (v0 < t.n_vec) {
    const int64_t left = t.n_vec - v0;
    if (left >= 5 || left == 3) {
      q8_tile<Fmt, R, 3>(t, o, v0);
      v0 += 3;
    } else if (left >= 2) {
      q8_tile<Fmt, R, 2>(t, o, v0);
      v0 += 2;
    } else {
      q8_tile<Fmt, R, 1>(t, o, v0);
      v0 += 1;
    }
  }
}

// Rows of at most this many bytes take 8-row tiles at one vector (Q4_0 and Q4_K): twice the independent loads in
// flight on rows of a few cache lines each (ffn_down_exps, n_in 512: 0.52 → 0.64-0.73 of the read on the development
// VM, one and two threads; the 2048-wide rows measured slower so).
inline constexpr uint64_t kShortRowBytes = 512;

template <class Fmt>
void gemv_q8(const GemvTask& t, int64_t row_begin, int64_t row_end) {
  int64_t o = row_begin;
  if constexpr (Fmt::kShortRowTile8) {
    if (t.n_vec == 1 && t.row_bytes <= kShortRowBytes) {
      for (; o + 8 <= row_end; o += 8) q8_tile<Fmt, 8, 1>(t, o, 0);
    }
  }
  for (; o + 4 <= row_end; o += 4) q8_rows<Fmt, 4>(t, o);
  for (; o < row_end; ++o) q8_rows<Fmt, 1>(t, o);
}

}  // namespace kestrel::cpu::KESTREL_GEMV_NS

#undef KESTREL_INLINE
