// The SIMD GEMV kernels shared by the avx2 and avx512 translation units (gemv.h). Included only by gemv_avx2.cpp
// and gemv_avx512.cpp, each of which defines KESTREL_GEMV_NS (a namespace of its own, so the two copies compiled
// with different flags never merge at link time) and a Simd traits struct:
//   Vec, kLanes, zero(), loadu(const float*), fma(a, b, c) = a·b + c, add(a, b), hsum(Vec) (fixed order)
//
// Decoders turn kChunk elements of a row into f32 in a stack tile with AVX2 (+F16C) integer and float ops, producing
// exactly core/quant's values (q · d, or step · q − offset as two roundings: the files are compiled with
// -ffp-contract=off). F32 rows are read in place. The dot loop keeps four Vec accumulators per vector over element
// groups i ≡ 0, 1, 2, 3 (mod 4·kLanes) of the row, sums them as (a0 + a1) + (a2 + a3), reduces with hsum and adds a
// scalar tail (elements past the last whole group of kLanes, F32/F16/BF16 rows only). The order depends only on
// n_in, so a row's result does not depend on n_vec or on the caller's split of rows.
#pragma once

#ifndef KESTREL_GEMV_NS
#error "define KESTREL_GEMV_NS before including cpu/gemv_simd.h"
#endif
#if !defined(__AVX2__) || !defined(__F16C__) || !defined(__FMA__)
#error "cpu/gemv_simd.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/quant/blocks.h"
#include "cpu/gemv.h"

namespace kestrel::cpu::KESTREL_GEMV_NS {

inline constexpr int64_t kChunk = 256;  // elements decoded at a time: one K-quant super-block, 8 Q4_0/Q8_0 blocks
inline constexpr int64_t kMaxVec = 32;  // vectors sharing one decode of a chunk

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 int8 → 8 f32.
inline __m256 i8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// tile[0..32) = (bytes of q, as int8) · d for the 32 bytes of q.
inline void store_i8x32_scaled(__m256i q, __m256 d, float* tile) {
  const __m128i lo = _mm256_castsi256_si128(q);
  const __m128i hi = _mm256_extracti128_si256(q, 1);
  _mm256_storeu_ps(tile + 0, _mm256_mul_ps(i8x8_to_ps(lo), d));
  _mm256_storeu_ps(tile + 8, _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(lo, 8)), d));
  _mm256_storeu_ps(tile + 16, _mm256_mul_ps(i8x8_to_ps(hi), d));
  _mm256_storeu_ps(tile + 24, _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(hi, 8)), d));
}

// tile[0..32) = step · q − offset for the 32 unsigned bytes of q (K-quant sub-blocks: mul, then sub).
inline void store_u8x32_affine(__m256i q, __m256 step, __m256 offset, float* tile) {
  const __m128i lo = _mm256_castsi256_si128(q);
  const __m128i hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int j = 0; j < 4; ++j) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j]));
    _mm256_storeu_ps(tile + 8 * j, _mm256_sub_ps(_mm256_mul_ps(step, f), offset));
  }
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block.
inline void k4_scale_min(int j, const uint8_t* packed, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 0x3F;
    *min = packed[j + 4] & 0x3F;
  } else {
    *scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

struct DecodeF32 {
  static const float* decode(const uint8_t* row, int64_t base, int64_t, float*) {
    return reinterpret_cast<const float*>(row) + base;  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast): f32 rows
  }
};

struct DecodeF16 {
  static const float* decode(const uint8_t* row, int64_t base, int64_t len, float* tile) {
    const uint8_t* src = row + base * 2;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
      _mm256_storeu_ps(tile + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
    }
    for (; i < len; ++i) tile[i] = half_at(src + 2 * i);
    return tile;
  }
};

struct DecodeBf16 {
  static const float* decode(const uint8_t* row, int64_t base, int64_t len, float* tile) {
    const uint8_t* src = row + base * 2;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
      _mm256_storeu_ps(tile + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < len; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(tile + i, &bits, 4);
    }
    return tile;
  }
};

struct DecodeQ8_0 {
  static const float* decode(const uint8_t* row, int64_t base, int64_t len, float* tile) {
    const uint8_t* blk = row + (base / kQK8_0) * sizeof(BlockQ8_0);
    for (int64_t b = 0; b < len / kQK8_0; ++b, blk += sizeof(BlockQ8_0)) {
      const __m256 d = _mm256_set1_ps(half_at(blk));
      store_i8x32_scaled(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), d, tile + b * kQK8_0);
    }
    return tile;
  }
};

struct DecodeQ4_0 {
  static const float* decode(const uint8_t* row, int64_t base, int64_t len, float* tile) {
    const uint8_t* blk = row + (base / kQK4_0) * sizeof(BlockQ4_0);
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < len / kQK4_0; ++b, blk += sizeof(BlockQ4_0)) {
      const __m256 d = _mm256_set1_ps(half_at(blk));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, mask), eight);                     // elements 0..15
      const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), eight);  // elements 16..31
      store_i8x32_scaled(_mm256_set_m128i(hi, lo), d, tile + b * kQK4_0);
    }
    return tile;
  }
};

struct DecodeQ4_K {
  static const float* decode(const uint8_t* row, int64_t base, int64_t, float* tile) {
    const uint8_t* blk = row + (base / kQK_K) * sizeof(BlockQ4_K);
    const float d = half_at(blk), dmin = half_at(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qs = blk + 4 + kKScaleSize;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      int sc_lo, m_lo, sc_hi, m_hi;
      k4_scale_min(2 * c, scales, &sc_lo, &m_lo);
      k4_scale_min(2 * c + 1, scales, &sc_hi, &m_hi);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      store_u8x32_affine(_mm256_and_si256(q, mask), _mm256_set1_ps(d * static_cast<float>(sc_lo)),
                         _mm256_set1_ps(dmin * static_cast<float>(m_lo)), tile + 64 * c);
      store_u8x32_affine(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), _mm256_set1_ps(d * static_cast<float>(sc_hi)),
                         _mm256_set1_ps(dmin * static_cast<float>(m_hi)), tile + 64 * c + 32);
    }
    return tile;
  }
};

struct DecodeQ5_K {
  static const float* decode(const uint8_t* row, int64_t base, int64_t, float* tile) {
    const uint8_t* blk = row + (base / kQK_K) * sizeof(BlockQ5_K);
    const float d = half_at(blk), dmin = half_at(blk + 2);
    const uint8_t* scales = blk + 4;
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 4 + kKScaleSize));
    const uint8_t* qs = blk + 4 + kKScaleSize + kQK_K / 8;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi8(1);
    for (int c = 0; c < 4; ++c) {
      int sc_lo, m_lo, sc_hi, m_hi;
      k4_scale_min(2 * c, scales, &sc_lo, &m_lo);
      k4_scale_min(2 * c + 1, scales, &sc_hi, &m_hi);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      // Bit 2c (2c + 1) of qh[l] is bit 4 of element 64c + l (64c + 32 + l); masking per byte after the 16-bit
      // shift drops the bits that crossed from the neighbouring byte.
      const __m128i sh_lo = _mm_cvtsi32_si128(2 * c), sh_hi = _mm_cvtsi32_si128(2 * c + 1);
      const __m256i h_lo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, sh_lo), one), 4);
      const __m256i h_hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, sh_hi), one), 4);
      store_u8x32_affine(_mm256_or_si256(_mm256_and_si256(q, mask), h_lo),
                         _mm256_set1_ps(d * static_cast<float>(sc_lo)), _mm256_set1_ps(dmin * static_cast<float>(m_lo)),
                         tile + 64 * c);
      store_u8x32_affine(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), h_hi),
                         _mm256_set1_ps(d * static_cast<float>(sc_hi)), _mm256_set1_ps(dmin * static_cast<float>(m_hi)),
                         tile + 64 * c + 32);
    }
    return tile;
  }
};

struct DecodeQ6_K {
  static const float* decode(const uint8_t* row, int64_t base, int64_t, float* tile) {
    const uint8_t* blk = row + (base / kQK_K) * sizeof(BlockQ6_K);
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + kQK_K / 2;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + kQK_K / 2 + kQK_K / 4);
    const float d = half_at(blk + kQK_K / 2 + kQK_K / 4 + kQK_K / 16);
    const __m256i mask4 = _mm256_set1_epi8(0x0F);
    const __m256i mask2 = _mm256_set1_epi8(0x03);
    const __m256i off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
      // Quants 0..63 minus 32 fit int8. Group j (elements 128h + 32j + l) takes bits 2j..2j+1 of qh.
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, mask4), _mm256_slli_epi16(_mm256_and_si256(hb, mask2), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, mask4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), mask2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), mask4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), mask2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), mask4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), mask2), 4)),
      };
      for (int j = 0; j < 4; ++j) {
        const __m256i qs = _mm256_sub_epi8(q[j], off);
        float* out = tile + 128 * h + 32 * j;
        const int s = 8 * h + 2 * j;  // scale of elements l < 16; s + 1 for l >= 16
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(sc[s]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc[s + 1]));
        const __m128i lo = _mm256_castsi256_si128(qs);
        const __m128i hi = _mm256_extracti128_si256(qs, 1);
        _mm256_storeu_ps(out + 0, _mm256_mul_ps(d0, i8x8_to_ps(lo)));
        _mm256_storeu_ps(out + 8, _mm256_mul_ps(d0, i8x8_to_ps(_mm_srli_si128(lo, 8))));
        _mm256_storeu_ps(out + 16, _mm256_mul_ps(d1, i8x8_to_ps(hi)));
        _mm256_storeu_ps(out + 24, _mm256_mul_ps(d1, i8x8_to_ps(_mm_srli_si128(hi, 8))));
      }
    }
    return tile;
  }
};

template <class S, class Decoder>
void gemv_rows(const GemvTask& t, int64_t row_begin, int64_t row_end) {
  using Vec = typename S::Vec;
  constexpr int64_t L = S::kLanes;
  alignas(64) float tile[kChunk];  // f32 [kChunk]: one decoded chunk of a row
  Vec acc[kMaxVec][4];             // per vector of the group: the four accumulators
  float tail[kMaxVec];             // per vector: the scalar tail
  for (int64_t o = row_begin; o < row_end; ++o) {
    const uint8_t* row = t.w + static_cast<uint64_t>(o) * t.row_bytes;
    for (int64_t v0 = 0; v0 < t.n_vec; v0 += kMaxVec) {
      const int64_t nv = std::min(kMaxVec, t.n_vec - v0);
      for (int64_t v = 0; v < nv; ++v) {
        for (Vec& a : acc[v]) a = S::zero();
        tail[v] = 0.0f;
      }
      for (int64_t base = 0; base < t.n_in; base += kChunk) {
        const int64_t len = std::min(kChunk, t.n_in - base);
        const float* w = Decoder::decode(row, base, len, tile);
        const int64_t n_full = len / L * L;
        for (int64_t v = 0; v < nv; ++v) {
          const float* x = t.x + gemv_x_row(t, v0 + v) * t.n_in + base;
          Vec a0 = acc[v][0], a1 = acc[v][1], a2 = acc[v][2], a3 = acc[v][3];
          int64_t i = 0;
          for (; i + 4 * L <= n_full; i += 4 * L) {
            a0 = S::fma(S::loadu(w + i), S::loadu(x + i), a0);
            a1 = S::fma(S::loadu(w + i + L), S::loadu(x + i + L), a1);
            a2 = S::fma(S::loadu(w + i + 2 * L), S::loadu(x + i + 2 * L), a2);
            a3 = S::fma(S::loadu(w + i + 3 * L), S::loadu(x + i + 3 * L), a3);
          }
          // Only a row's last chunk can end inside a group of 4·L (kChunk is a multiple of 4·L).
          Vec* const rest[3] = {&a0, &a1, &a2};
          for (Vec* a : rest) {
            if (i + L > n_full) break;
            *a = S::fma(S::loadu(w + i), S::loadu(x + i), *a);
            i += L;
          }
          acc[v][0] = a0;
          acc[v][1] = a1;
          acc[v][2] = a2;
          acc[v][3] = a3;
          float tl = tail[v];
          for (; i < len; ++i) tl += w[i] * x[i];
          tail[v] = tl;
        }
      }
      for (int64_t v = 0; v < nv; ++v) {
        const Vec s = S::add(S::add(acc[v][0], acc[v][1]), S::add(acc[v][2], acc[v][3]));
        t.y[(v0 + v) * t.n_out + o] = S::hsum(s) + tail[v];
      }
    }
  }
}

// The table of this level.
template <class S>
constexpr GemvKernels make_kernels() {
  GemvKernels k;
  k.f32.on_f32 = gemv_rows<S, DecodeF32>;
  k.f16.on_f32 = gemv_rows<S, DecodeF16>;
  k.bf16.on_f32 = gemv_rows<S, DecodeBf16>;
  k.q8_0.on_f32 = gemv_rows<S, DecodeQ8_0>;
  k.q4_0.on_f32 = gemv_rows<S, DecodeQ4_0>;
  k.q4_k.on_f32 = gemv_rows<S, DecodeQ4_K>;
  k.q5_k.on_f32 = gemv_rows<S, DecodeQ5_K>;
  k.q6_k.on_f32 = gemv_rows<S, DecodeQ6_K>;
  return k;
}

}  // namespace kestrel::cpu::KESTREL_GEMV_NS
