// AVX2 GEMV kernels for the block-quantized weight types on int8 activations (act_q8.h): Q4_0 and Q8_0 on the
// per-32 form (kQ8), Q4_K, Q5_K and Q6_K on the per-256 form (kQ8K). Included by gemv_avx2.cpp and
// gemv_avxvnni.cpp after gemv_simd.h (whose half_at it uses), so it is compiled with that file's flags, and
// parametrised by the integer dot products of the level (a Dot policy):
//   u8(acc, u, q)   acc + Σ of 4 products u·q per 32-bit lane (u unsigned bytes <= 128, q int8)
//   i16(acc, a, b)  acc + Σ of 2 products a·b per 32-bit lane (int16)
// DotMaddubs (plain AVX2): vpmaddubsw then vpmaddwd — no int16 pair sum can saturate, since every u here is at
// most 128 and every |q| at most 127 (2·128·127 < 2^15) — and a vpaddd; DotVnni (AVX-VNNI, gemv_avxvnni.cpp):
// vpdpbusd / vpdpwssd. Both give the same int32 values, so the avx2 and avxvnni levels give the same bits.
//
// Why int8: the f32 kernels (gemv_simd.h) widen, convert, scale and FMA every 8 weights, far below the memory's
// pace; here 32 weights are one register of bytes and one or two integer instructions multiply them by 32
// activations (docs/benchmarks.md: the int8 and f32 CPU GEMV rows).
//
// Q4_0 / Q8_0, per 32-element block and (row, vector) pair: p = dot(u, q) (+ 8·ns4 for Q4_0, whose nibbles are
// w + 8; Q8_0 enters as |w| against sign(q, w)), then acc += float(p) · (d_w · d_x). The weight and activation
// scales differ per block, so every block ends in f32.
// Q4_K / Q5_K / Q6_K, per 256-element super-block: the sub-block scales are small integers and the activations
// have one scale per super-block, so the pair sums sumi = Σ_j sc_j · Σ_{i∈j} u_i·q_i in int32 (vpmaddubsw, then
// vpmaddwd by the scale), less the offset or min terms from the activations' 16-element sums (bsum): Q6_K's
// −32·Σ_g sc_g·bsum_g joins sumi, Q4_K/Q5_K's mins take their own f32 term. Per super-block and pair:
//   acc += float(sumi) · (d · dk)  [ − float(Σ_j m_j · bsum_j) · (dmin · dk) ]
// Integer sums are exact (|sumi| < 2^28), so a result differs from ref::matvec_batch(W, x̃) by f32 rounding only.
//
// Tiles: R rows (4, or 1 for the rest) × V vectors (1 or 2); each (row, vector) accumulator sees the same operations
// in the same order whatever R and V are, and its 8 lanes are reduced in a fixed order (hsum8) at the end of the
// row, so a row's result does not depend on the batch or on how rows are split. Each tile prefetches the next
// tile's rows at the same offset, as the AVX-512 kernels do.
#pragma once

#ifndef KESTREL_GEMV_NS
#error "include cpu/gemv_simd.h (with KESTREL_GEMV_NS) before cpu/gemv_q8_avx2.h"
#endif

#include <immintrin.h>

#include <cstring>

#include "core/quant/blocks.h"
#include "cpu/act_q8.h"
#include "cpu/gemv.h"
#include "cpu/simd_f32.h"

// The small loops over a tile's rows, vectors and chunks must unroll fully (KESTREL_SIMD_UNROLL, simd_f32.h), and a
// format's unit / block / tail must inline into the tile, so that the accumulators stay in registers rather than pass
// through memory every unit.
#define KESTREL_INLINE __attribute__((always_inline)) inline

namespace kestrel::cpu::KESTREL_GEMV_NS {

struct DotMaddubs {
  static __m256i u8(__m256i acc, __m256i u, __m256i q) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)));
  }
  static __m256i i16(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
};

// One vector's quantized activations (the arrays of the form its kernel reads).
struct Q8Vec {
  const int8_t* q;      // kQ8
  const float* dl;      // kQ8
  const int32_t* ns4;   // kQ8
  const int8_t* qk;     // kQ8K
  const float* dk;      // kQ8K
  const int16_t* bsum;  // kQ8K
};

// The sum of the 8 lanes in a fixed order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Q4_0 and Q8_0 (32-element blocks of one f16 scale): a unit is 8 blocks (the prefetch step); a row's last blocks
// that do not fill a unit go one by one (tail).
template <bool kQ8, class Dot>
struct FmtBlock32 {
  static constexpr int64_t kBlockElems = 32;
  static constexpr uint64_t kBlockBytes = kQ8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  static constexpr int64_t kUnit = 8 * kBlockElems;

  // One block at element `base` for every (row, vector).
  template <int R, int V>
  KESTREL_INLINE static void block(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m256 (&acc)[R][V]) {
    const uint64_t off = static_cast<uint64_t>(base / 32) * kBlockBytes;
    __m256i w[R];  // Q4_0: the nibbles, unsigned (w + 8); Q8_0: the signed weights
    float ws[R];   // the blocks' scales
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      ws[r] = half_at(row[r] + off);
      if constexpr (kQ8) {
        w[r] = load32(row[r] + off + 2);
      } else {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + off + 2));
        w[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
      }
    }
    KESTREL_SIMD_UNROLL
    for (int v = 0; v < V; ++v) {
      const __m256i q = load32(x[v].q + base);
      const float dx = x[v].dl[base / 4];
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        __m256i p;
        if constexpr (kQ8) {
          p = Dot::u8(_mm256_setzero_si256(), _mm256_abs_epi8(w[r]), _mm256_sign_epi8(q, w[r]));
        } else {
          const __m256i corr = _mm256_slli_epi32(load32(x[v].ns4 + base / 4), 3);
          p = Dot::u8(corr, w[r], q);
        }
        acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(ws[r] * dx), acc[r][v]);
      }
    }
  }

  template <int R, int V>
  KESTREL_INLINE static void unit(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m256 (&acc)[R][V]) {
    for (int k = 0; k < 8; ++k) block<R, V>(row, base + 32 * k, x, acc);
  }

  template <int R, int V>
  KESTREL_INLINE static void tail(const uint8_t* const* row, int64_t base, int64_t n_in, const Q8Vec* x,
                                  __m256 (&acc)[R][V]) {
    for (; base < n_in; base += 32) block<R, V>(row, base, x, acc);
  }
};

// The 8 six-bit scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4
// for j = 0..7).
inline __m128i k4_scales_mins_bytes(const uint8_t* packed) {
  uint32_t w[4];
  std::memcpy(w, packed, 12);
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kTop2 = 0x03030303;
  w[3] = ((w[2] >> 4) & kLow4) | (((w[1] >> 6) & kTop2) << 4);  // mins 4..7
  const uint32_t mins_lo = w[1] & kLow6;                        // mins 0..3
  w[1] = (w[2] & kLow4) | (((w[0] >> 6) & kTop2) << 4);         // scales 4..7
  w[2] = mins_lo;
  w[0] &= kLow6;  // scales 0..3
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
}

// The int16 lane j of each 128-bit half of v in all 8 lanes of that half.
inline __m256i broadcast_i16_lane(__m256i v, int j) {
  const __m256i idx = _mm256_set1_epi16(static_cast<int16_t>((2 * j) | ((2 * j + 1) << 8)));
  return _mm256_shuffle_epi8(v, idx);
}

// Q4_K and Q5_K: a unit is a super-block of 256, four chunks of 64 = sub-blocks 2c (low nibbles) and 2c + 1 (high).
template <bool kFive, class Dot>
struct FmtK45 {
  static constexpr int64_t kUnit = 256;
  static constexpr int64_t kBlockElems = 256;
  static constexpr uint64_t kBlockBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);

  template <int R, int V>
  KESTREL_INLINE static void unit(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m256 (&acc)[R][V]) {
    const uint64_t sb = static_cast<uint64_t>(base / 256);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint8_t* blk[R];
    __m128i sm[R];  // scales in bytes 0..7, mins in 8..15
    __m256i sc[R];  // the scales as int16 in lanes 0..7 of both halves
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      blk[r] = row[r] + sb * kBlockBytes;
      sm[r] = k4_scales_mins_bytes(blk[r] + 4);
      sc[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm[r]));
    }
    __m256i sumi[R][V];
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      KESTREL_SIMD_UNROLL
      for (int v = 0; v < V; ++v) sumi[r][v] = _mm256_setzero_si256();
    }
    const uint64_t qs_off = kFive ? 48 : 16;
    KESTREL_SIMD_UNROLL
    for (int c = 0; c < 4; ++c) {
      __m256i ulo[R], uhi[R];
      KESTREL_SIMD_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256i y = load32(blk[r] + qs_off + 32 * c);
        ulo[r] = _mm256_and_si256(y, m4);
        uhi[r] = _mm256_and_si256(_mm256_srli_epi16(y, 4), m4);
        if constexpr (kFive) {
          // Bit 2c of qh[l] is bit 4 of element 64c + l, bit 2c + 1 that of element 64c + 32 + l.
          const __m256i qh = load32(blk[r] + 16);
          const __m256i one = _mm256_set1_epi8(1);
          const __m128i s_lo = _mm_cvtsi32_si128(2 * c), s_hi = _mm_cvtsi32_si128(2 * c + 1);
          ulo[r] = _mm256_or_si256(ulo[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s_lo), one), 4));
          uhi[r] = _mm256_or_si256(uhi[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s_hi), one), 4));
        }
      }
      KESTREL_SIMD_UNROLL
      for (int v = 0; v < V; ++v) {
        const __m256i qlo = load32(x[v].qk + base + 64 * c);
        const __m256i qhi = load32(x[v].qk + base + 64 * c + 32);
        KESTREL_SIMD_UNROLL
        for (int r = 0; r < R; ++r) {
          sumi[r][v] = Dot::i16(sumi[r][v], _mm256_maddubs_epi16(ulo[r], qlo), broadcast_i16_lane(sc[r], 2 * c));
          sumi[r][v] = Dot::i16(sumi[r][v], _mm256_maddubs_epi16(uhi[r], qhi), broadcast_i16_lane(sc[r], 2 * c + 1));
        }
      }
    }
    // Mins: m_j against the sub-block's two bsums, (m0, m0, m1, m1, ...) as int16.
    const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      const float d = half_at(blk[r]), dmin = half_at(blk[r] + 2);
      const __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm[r], dup));
      KESTREL_SIMD_UNROLL
      for (int v = 0; v < V; ++v) {
        const float dk = x[v].dk[sb];
        const __m256i mb = _mm256_madd_epi16(load32(x[v].bsum + base / 16), mins);
        acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r][v]), _mm256_set1_ps(d * dk), acc[r][v]);
        acc[r][v] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mb), _mm256_set1_ps(dmin * dk), acc[r][v]);
      }
    }
  }
};

// Q6_K: a unit is a super-block of 256 in two halves of 128, each four groups of 32 with two scales (16 elements
// each); quants 0..63 enter unsigned, offset 32.
template <class Dot>
struct FmtQ6_K {
  static constexpr int64_t kUnit = 256;
  static constexpr int64_t kBlockElems = 256;
  static constexpr uint64_t kBlockBytes = sizeof(BlockQ6_K);

  template <int R, int V>
  KESTREL_INLINE static void unit(const uint8_t* const* row, int64_t base, const Q8Vec* x, __m256 (&acc)[R][V]) {
    const uint64_t sb = static_cast<uint64_t>(base / 256);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    const uint8_t* blk[R];
    __m256i sc[R][2];  // half h's 8 scales as int16 in lanes 0..7 of both 128-bit halves
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      blk[r] = row[r] + sb * kBlockBytes;
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + 192));
      sc[r][0] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8));
      sc[r][1] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(s8, 8)));
    }
    __m256i sumi[R][V];
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      KESTREL_SIMD_UNROLL
      for (int v = 0; v < V; ++v) sumi[r][v] = _mm256_setzero_si256();
    }
    KESTREL_SIMD_UNROLL
    for (int h = 0; h < 2; ++h) {
      KESTREL_SIMD_UNROLL
      for (int j = 0; j < 4; ++j) {
        // Group j of half h: elements 128h + 32j + l, low 4 bits from ql (byte 64h + 32(j & 1) + l, low nibble for
        // j < 2), high 2 bits from qh[32h + l] bits 2j..2j+1; scales 8h + 2j (l < 16) and 8h + 2j + 1.
        __m256i u[R], s[R];
        KESTREL_SIMD_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256i l = load32(blk[r] + 64 * h + 32 * (j & 1));
          const __m256i hb = load32(blk[r] + 128 + 32 * h);
          const __m256i lo = j < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), m2);
          u[r] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
          // Low 128 bits (elements l < 16): scale 2j of the half; high 128 bits: 2j + 1.
          const __m256i idx =
              _mm256_setr_epi8(static_cast<char>(4 * j), static_cast<char>(4 * j + 1), static_cast<char>(4 * j),
                               static_cast<char>(4 * j + 1), static_cast<char>(4 * j), static_cast<char>(4 * j + 1),
                               static_cast<char>(4 * j), static_cast<char>(4 * j + 1), static_cast<char>(4 * j),
                               static_cast<char>(4 * j + 1), static_cast<char>(4 * j), static_cast<char>(4 * j + 1),
                               static_cast<char>(4 * j), static_cast<char>(4 * j + 1), static_cast<char>(4 * j),
                               static_cast<char>(4 * j + 1), static_cast<char>(4 * j + 2), static_cast<char>(4 * j + 3),
                               static_cast<char>(4 * j + 2), static_cast<char>(4 * j + 3), static_cast<char>(4 * j + 2),
                               static_cast<char>(4 * j + 3), static_cast<char>(4 * j + 2), static_cast<char>(4 * j + 3),
                               static_cast<char>(4 * j + 2), static_cast<char>(4 * j + 3), static_cast<char>(4 * j + 2),
                               static_cast<char>(4 * j + 3), static_cast<char>(4 * j + 2), static_cast<char>(4 * j + 3),
                               static_cast<char>(4 * j + 2), static_cast<char>(4 * j + 3));
          s[r] = _mm256_shuffle_epi8(sc[r][h], idx);
        }
        KESTREL_SIMD_UNROLL
        for (int v = 0; v < V; ++v) {
          const __m256i q = load32(x[v].qk + base + 128 * h + 32 * j);
          KESTREL_SIMD_UNROLL
          for (int r = 0; r < R; ++r) sumi[r][v] = Dot::i16(sumi[r][v], _mm256_maddubs_epi16(u[r], q), s[r]);
        }
      }
    }
    // The offset: −32 · Σ_g sc_g · bsum_g, in the same int32 lanes.
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < R; ++r) {
      const float d = half_at(blk[r] + 208);
      const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + 192)));
      KESTREL_SIMD_UNROLL
      for (int v = 0; v < V; ++v) {
        const __m256i off = _mm256_madd_epi16(load32(x[v].bsum + base / 16), s16);
        const __m256i total = _mm256_sub_epi32(sumi[r][v], _mm256_slli_epi32(off, 5));
        acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * x[v].dk[sb]), acc[r][v]);
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
    const ActQ8View& a = t.xq;
    x[v] = Q8Vec{a.q != nullptr ? a.q + vv * t.n_in : nullptr,
                 a.dl != nullptr ? a.dl + vv * (t.n_in / 4) : nullptr,
                 a.ns4 != nullptr ? a.ns4 + vv * (t.n_in / 4) : nullptr,
                 a.qk != nullptr ? a.qk + vv * t.n_in : nullptr,
                 a.dk != nullptr ? a.dk + vv * (t.n_in / kActQ8KBlock) : nullptr,
                 a.bsum != nullptr ? a.bsum + vv * (t.n_in / kActQ8KSum) : nullptr};
  }
  __m256 acc[R][V];
  KESTREL_SIMD_UNROLL
  for (int r = 0; r < R; ++r) {
    KESTREL_SIMD_UNROLL
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  }
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
    for (int v = 0; v < V; ++v) t.y[(v0 + v) * t.n_out + o + r] = hsum8(acc[r][v]);
  }
}

#ifndef KESTREL_RT
#define KESTREL_RT 4
#define KESTREL_VT 2
#endif
template <class Fmt, int R>
void q8_rows(const GemvTask& t, int64_t o) {
  int64_t v0 = 0;
  for (; v0 + KESTREL_VT <= t.n_vec; v0 += KESTREL_VT) q8_tile<Fmt, R, KESTREL_VT>(t, o, v0);
  for (; v0 < t.n_vec; ++v0) q8_tile<Fmt, R, 1>(t, o, v0);
}

template <class Fmt>
void gemv_q8(const GemvTask& t, int64_t row_begin, int64_t row_end) {
  int64_t o = row_begin;
  for (; o + KESTREL_RT <= row_end; o += KESTREL_RT) q8_rows<Fmt, KESTREL_RT>(t, o);
  for (; o < row_end; ++o) q8_rows<Fmt, 1>(t, o);
}

// The int8 kernels of a level with integer dot products Dot, into its table.
template <class Dot>
void add_q8_kernels(GemvKernels& k) {
  k.q8_0.on_q8 = gemv_q8<FmtBlock32<true, Dot>>;
  k.q4_0.on_q8 = gemv_q8<FmtBlock32<false, Dot>>;
  k.q4_k = {k.q4_k.on_f32, gemv_q8<FmtK45<false, Dot>>, GemvInput::kQ8K};
  k.q5_k = {k.q5_k.on_f32, gemv_q8<FmtK45<true, Dot>>, GemvInput::kQ8K};
  k.q6_k = {k.q6_k.on_f32, gemv_q8<FmtQ6_K<Dot>>, GemvInput::kQ8K};
}

}  // namespace kestrel::cpu::KESTREL_GEMV_NS

#undef KESTREL_INLINE
