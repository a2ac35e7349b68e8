// The SIMD delta rule kernels shared by delta_rule_avx2.cpp and delta_rule_avx512.cpp (delta_rule.h). Each includer
// defines KESTREL_DR_NS (a namespace of its own, so copies compiled with different flags never merge at link time)
// and a traits struct S:
//   Vec, kLanes, kBlockVecs (vectors of a row kept per accumulator row: 4 with 32 registers, 2 with 16),
//   zero(), set1(float), loadu(const float*), storeu(float*, Vec), add, sub, mul, fma(a, b, c) = a·b + c,
//   fnma(a, b, c) = c − a·b, hsum(Vec) (fixed order)
// d_k and d_v are multiples of kLanes (delta_rule_kernels() checks). Row-blocked products work on 4 rows of the
// output at a time (a chunk of 64 tokens is 16 blocks) and kBlockVecs vectors of the row's width per pass.
#pragma once

#ifndef KESTREL_DR_NS
#error "define KESTREL_DR_NS before including cpu/delta_rule_simd.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/delta_rule.h"
#include "cpu/simd_f32.h"

namespace kestrel::cpu::KESTREL_DR_NS {

inline constexpr int C = kDeltaRuleChunk;
inline constexpr int kRows = 4;  // output rows per register block

#define KESTREL_DR_INLINE __attribute__((always_inline)) inline

// f(j0, nb) for the column blocks j0 = 0, kVecs·L, … of a row of `width` floats; nb, the block's vectors, as a
// compile-time constant (simd::with_vecs), so the block's arrays stay in registers.
template <class S, int kVecs, class F>
KESTREL_DR_INLINE void for_col_blocks(int64_t width, F&& f) {
  constexpr int L = S::kLanes;
  for (int64_t j0 = 0; j0 < width; j0 += kVecs * L) {
    simd::with_vecs<kVecs>(
        static_cast<int>(std::min<int64_t>(kVecs, (width - j0) / L)), [&](auto nb) __attribute__((always_inline)) {
          f(j0, nb);
        });
  }
}

// A register block of kRows rows × nb vectors: a[r][b] holds p[r·ld + b·L ..].
template <class S, int nb>
using Block = typename S::Vec[kRows][nb];

template <class S, int nb>
KESTREL_DR_INLINE void zero_block(Block<S, nb>& a) {
  KESTREL_SIMD_UNROLL
  for (int r = 0; r < kRows; ++r) {
    KESTREL_SIMD_UNROLL
    for (int b = 0; b < nb; ++b) a[r][b] = S::zero();
  }
}

template <class S, int nb>
KESTREL_DR_INLINE void load_block(Block<S, nb>& a, const float* p, int64_t ld) {
  KESTREL_SIMD_UNROLL
  for (int r = 0; r < kRows; ++r) {
    KESTREL_SIMD_UNROLL
    for (int b = 0; b < nb; ++b) a[r][b] = S::loadu(p + r * ld + b * S::kLanes);
  }
}

template <class S, int nb>
KESTREL_DR_INLINE void store_block(const Block<S, nb>& a, float* p, int64_t ld) {
  KESTREL_SIMD_UNROLL
  for (int r = 0; r < kRows; ++r) {
    KESTREL_SIMD_UNROLL
    for (int b = 0; b < nb; ++b) S::storeu(p + r * ld + b * S::kLanes, a[r][b]);
  }
}

// a[r][b] ← a[r][b] + coef(r, i)·X[i·ld + b·L ..] (kSub: − ) for i = 0 .. n − 1 in order: the block's rank-1 updates
// from n rows of X, each row of X loaded once for the kRows rows.
template <class S, bool kSub, int nb, class Coef>
KESTREL_DR_INLINE void accumulate_rows(Block<S, nb>& a, const float* X, int64_t ld, int64_t n, Coef&& coef) {
  using Vec = typename S::Vec;
  for (int64_t i = 0; i < n; ++i) {
    Vec x[nb];
    KESTREL_SIMD_UNROLL
    for (int b = 0; b < nb; ++b) x[b] = S::loadu(X + i * ld + b * S::kLanes);
    KESTREL_SIMD_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const Vec w = S::set1(coef(r, i));
      KESTREL_SIMD_UNROLL
      for (int b = 0; b < nb; ++b) a[r][b] = kSub ? S::fnma(w, x[b], a[r][b]) : S::fma(w, x[b], a[r][b]);
    }
  }
}

// One token: m = Σ_i (e^g·S[i])·k_i; δ = (v − m)·β; S[i] ← e^g·S[i] + k_i·δ; o = Σ_i S[i]·q_i — two passes over
// the state, kBlockVecs vectors of each row at a time.
template <class S>
void step(const float* q, const float* k, const float* v, float g, float beta, int d_k, int d_v, float* s, float* o) {
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes, B = 2 * S::kBlockVecs;
  const Vec decay = S::set1(std::exp(g));
  const Vec vbeta = S::set1(beta);
  for_col_blocks<S, B>(
      d_v, [&](int64_t j0, auto nbc) __attribute__((always_inline)) {
        constexpr int nb = decltype(nbc)::value;
        Vec m[nb], acc[nb];
        KESTREL_SIMD_UNROLL
        for (int b = 0; b < nb; ++b) m[b] = acc[b] = S::zero();
        for (int i = 0; i < d_k; ++i) {
          const Vec ki = S::set1(k[i]);
          const float* row = s + static_cast<int64_t>(i) * d_v + j0;
          KESTREL_SIMD_UNROLL
          for (int b = 0; b < nb; ++b) m[b] = S::fma(S::mul(decay, S::loadu(row + b * L)), ki, m[b]);
        }
        Vec delta[nb];
        KESTREL_SIMD_UNROLL
        for (int b = 0; b < nb; ++b) delta[b] = S::mul(S::sub(S::loadu(v + j0 + b * L), m[b]), vbeta);
        for (int i = 0; i < d_k; ++i) {
          const Vec ki = S::set1(k[i]), qi = S::set1(q[i]);
          float* row = s + static_cast<int64_t>(i) * d_v + j0;
          KESTREL_SIMD_UNROLL
          for (int b = 0; b < nb; ++b) {
            const Vec sn = S::fma(ki, delta[b], S::mul(decay, S::loadu(row + b * L)));
            S::storeu(row + b * L, sn);
            acc[b] = S::fma(sn, qi, acc[b]);
          }
        }
        KESTREL_SIMD_UNROLL
        for (int b = 0; b < nb; ++b) S::storeu(o + j0 + b * L, acc[b]);
      });
}

template <class S>
float dot(const float* a, const float* b, int n) {
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes;
  Vec a0 = S::zero(), a1 = S::zero();
  int i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 = S::fma(S::loadu(a + i), S::loadu(b + i), a0);
    a1 = S::fma(S::loadu(a + i + L), S::loadu(b + i + L), a1);
  }
  if (i < n) a0 = S::fma(S::loadu(a + i), S::loadu(b + i), a0);  // n is a multiple of L
  return S::hsum(S::add(a0, a1));
}

// X[t] ← Σ_{u<=t} T[t][u]·X[u] for the C rows of X (width w, row stride w), T lower triangular (zero above the
// diagonal): descending 4-row blocks, so each block reads only rows not yet overwritten.
template <class S>
void lower_matmul_inplace(const float* T, float* X, int w) {
  for (int t0 = C - kRows; t0 >= 0; t0 -= kRows) {
    for_col_blocks<S, S::kBlockVecs>(
        w, [&](int64_t j0, auto nbc) __attribute__((always_inline)) {
          constexpr int nb = decltype(nbc)::value;
          Block<S, nb> acc;
          zero_block<S, nb>(acc);
          accumulate_rows<S, false, nb>(acc, X + j0, w, t0 + kRows,
                                        [&](int r, int64_t u) { return T[(t0 + r) * C + u]; });
          store_block<S, nb>(acc, X + static_cast<int64_t>(t0) * w + j0, w);
        });
  }
}

// Per-thread scratch of one chunk, grown once (floats).
inline float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// One chunk of C tokens (ref::delta_rule_chunked's steps, delta_rule.h).
template <class S>
void chunk(const DeltaRuleChunk& c, int d_k, int d_v, float* s) {
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes, B = S::kBlockVecs;
  const int64_t dk = d_k, dv = d_v;
  float* G = scratch(static_cast<size_t>(2 * C + 2 * C * C + C * (dk + dv)));
  float* T = G + C;        // f32 [C][C]: −strict_lower((β⊙K)Kᵀ ⊙ Γ), then T
  float* QK = T + C * C;   // f32 [C][C]: lower_incl_diag(Q̂ K̂ᵀ ⊙ Γ)
  float* U = QK + C * C;   // f32 [C][dv]: β⊙V, then U = T (β⊙V), then V' = U − W S
  float* W = U + C * dv;   // f32 [C][dk]: β⊙K⊙e^G, then W = T (β⊙K⊙e^G), then K̂ ⊙ e^{G_last − G}
  float* eG = W + C * dk;  // f32 [C]: e^{G_t}
  auto q = [&](int t) { return c.q + t * c.qk_stride; };
  auto k = [&](int t) { return c.k + t * c.qk_stride; };

  float acc = 0.0f;
  for (int t = 0; t < C; ++t) {
    acc += c.g[t * c.gate_stride];
    G[t] = acc;
    eG[t] = std::exp(acc);
  }
  // Γ_ts = e^{G_t − G_s} on the lower triangle only; A and the intra-chunk attention scores.
  for (int t = 0; t < C; ++t) {
    const float bt = c.beta[t * c.gate_stride];
    for (int u = 0; u < C; ++u) {
      const float gamma = u <= t ? std::exp(G[t] - G[u]) : 0.0f;
      T[t * C + u] = u < t ? -(bt * dot<S>(k(t), k(u), d_k) * gamma) : 0.0f;
      QK[t * C + u] = u <= t ? dot<S>(q(t), k(u), d_k) * gamma : 0.0f;
    }
  }
  // Forward substitution (HF's loop): row i ← row + Σ_{m<i} row[m]·A[m][:], rows above already final; the row's
  // entries at and right of the diagonal stay 0. Then T = A + I.
  for (int i = 1; i < C; ++i) {
    Vec r[C / L];
    KESTREL_SIMD_UNROLL
    for (int b = 0; b < C / L; ++b) r[b] = S::loadu(T + i * C + b * L);
    for (int m = 0; m < i; ++m) {
      const Vec a = S::set1(T[i * C + m]);
      KESTREL_SIMD_UNROLL
      for (int b = 0; b < C / L; ++b) r[b] = S::fma(a, S::loadu(T + m * C + b * L), r[b]);
    }
    KESTREL_SIMD_UNROLL
    for (int b = 0; b < C / L; ++b) S::storeu(T + i * C + b * L, r[b]);
  }
  for (int t = 0; t < C; ++t) T[t * C + t] += 1.0f;

  // U = T (β⊙V); W = T (β⊙K⊙e^G).
  for (int t = 0; t < C; ++t) {
    const float bt = c.beta[t * c.gate_stride];
    const float* vt = c.v + t * c.v_stride;
    for (int64_t j = 0; j < dv; ++j) U[t * dv + j] = vt[j] * bt;
    const float* kt = k(t);
    const float be = bt * eG[t];
    for (int64_t i = 0; i < dk; ++i) W[t * dk + i] = kt[i] * be;
  }
  lower_matmul_inplace<S>(T, U, d_v);
  lower_matmul_inplace<S>(T, W, d_k);

  // V' = U − W S.
  for (int t0 = 0; t0 < C; t0 += kRows) {
    for_col_blocks<S, B>(
        dv, [&](int64_t j0, auto nbc) __attribute__((always_inline)) {
          constexpr int nb = decltype(nbc)::value;
          Block<S, nb> a;
          load_block<S, nb>(a, U + t0 * dv + j0, dv);
          accumulate_rows<S, true, nb>(a, s + j0, dv, dk, [&](int r, int64_t i) { return W[(t0 + r) * dk + i]; });
          store_block<S, nb>(a, U + t0 * dv + j0, dv);
        });
  }

  // O = e^G ⊙ (Q̂ S) + lower_incl_diag(Q̂ K̂ᵀ ⊙ Γ) V', from the incoming state.
  for (int t0 = 0; t0 < C; t0 += kRows) {
    for_col_blocks<S, B>(
        dv, [&](int64_t j0, auto nbc) __attribute__((always_inline)) {
          constexpr int nb = decltype(nbc)::value;
          Block<S, nb> a;
          zero_block<S, nb>(a);
          accumulate_rows<S, false, nb>(a, s + j0, dv, dk, [&](int r, int64_t i) { return q(t0 + r)[i]; });
          KESTREL_SIMD_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const Vec e = S::set1(eG[t0 + r]);
            KESTREL_SIMD_UNROLL
            for (int b = 0; b < nb; ++b) a[r][b] = S::mul(a[r][b], e);
          }
          accumulate_rows<S, false, nb>(a, U + j0, dv, t0 + kRows,
                                        [&](int r, int64_t u) { return QK[(t0 + r) * C + u]; });
          store_block<S, nb>(a, c.o + t0 * c.o_stride + j0, c.o_stride);
        });
  }

  // S ← e^{G_last} S + (K̂ ⊙ e^{G_last − G})ᵀ V'.
  const float g_last = G[C - 1];
  for (int t = 0; t < C; ++t) {
    const float e = std::exp(g_last - G[t]);
    const float* kt = k(t);
    for (int64_t i = 0; i < dk; ++i) W[t * dk + i] = kt[i] * e;
  }
  const Vec e_last = S::set1(std::exp(g_last));
  for (int64_t i0 = 0; i0 < dk; i0 += kRows) {
    for_col_blocks<S, B>(
        dv, [&](int64_t j0, auto nbc) __attribute__((always_inline)) {
          constexpr int nb = decltype(nbc)::value;
          Block<S, nb> a;
          load_block<S, nb>(a, s + i0 * dv + j0, dv);
          KESTREL_SIMD_UNROLL
          for (int r = 0; r < kRows; ++r) {
            KESTREL_SIMD_UNROLL
            for (int b = 0; b < nb; ++b) a[r][b] = S::mul(a[r][b], e_last);
          }
          accumulate_rows<S, false, nb>(a, U + j0, dv, C, [&](int r, int64_t t) { return W[t * dk + i0 + r]; });
          store_block<S, nb>(a, s + i0 * dv + j0, dv);
        });
  }
}

template <class S>
constexpr DeltaRuleKernels make_kernels() {
  return DeltaRuleKernels{step<S>, chunk<S>};
}

}  // namespace kestrel::cpu::KESTREL_DR_NS

#undef KESTREL_DR_INLINE
