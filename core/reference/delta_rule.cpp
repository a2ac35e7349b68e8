// Reference gated delta rule: recurrent step and chunked prefill (see delta_rule.h for the math and sources).
#include "core/reference/delta_rule.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "core/reference/activations.h"

namespace kestrel::ref {

void delta_rule_step(const float* q, const float* k, const float* v, float g, float beta, int d_k, int d_v, float* s,
                     float* o) {
  const float decay = std::exp(g);
  const size_t n = static_cast<size_t>(d_k) * d_v;
  for (size_t e = 0; e < n; ++e) s[e] *= decay;  // decay first
  for (int j = 0; j < d_v; ++j) {
    float m = 0.0f;  // m_j = Σ_i S[i][j] k_i
    for (int i = 0; i < d_k; ++i) m += s[static_cast<size_t>(i) * d_v + j] * k[i];
    const float delta = (v[j] - m) * beta;
    for (int i = 0; i < d_k; ++i) s[static_cast<size_t>(i) * d_v + j] += k[i] * delta;
  }
  for (int j = 0; j < d_v; ++j) {
    float acc = 0.0f;  // o_j = Σ_i S[i][j] q_i on the updated state
    for (int i = 0; i < d_k; ++i) acc += s[static_cast<size_t>(i) * d_v + j] * q[i];
    o[j] = acc;
  }
}

namespace {

// Row-major f32 matrix with (row, col) access; scratch for one chunk.
struct Mat {
  int rows = 0, cols = 0;
  std::vector<float> a;
  Mat(int r, int c) : rows(r), cols(c), a(static_cast<size_t>(r) * c, 0.0f) {}
  float& operator()(int r, int c) { return a[static_cast<size_t>(r) * cols + c]; }
  float operator()(int r, int c) const { return a[static_cast<size_t>(r) * cols + c]; }
  float* row(int r) { return a.data() + static_cast<size_t>(r) * cols; }
  const float* row(int r) const { return a.data() + static_cast<size_t>(r) * cols; }
  void zero() { std::fill(a.begin(), a.end(), 0.0f); }
};

}  // namespace

void delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n_tok,
                        int d_k, int d_v, float* s, float* o, int chunk) {
  assert(chunk > 0);
  const int C = chunk;
  // Per-chunk scratch, zero-padded past the real tokens.
  Mat qc(C, d_k), kc(C, d_k), vc(C, d_v);  // q̂, k̂, v of the chunk
  std::vector<float> gc(static_cast<size_t>(C)), bc(static_cast<size_t>(C));
  std::vector<float> G(static_cast<size_t>(C));  // f32 [C]: in-chunk cumulative log decay
  Mat decay(C, C);                               // Γ, zero above the diagonal
  Mat A(C, C);                                   // −L, then (I + L)⁻¹ − I, then T
  Mat kbeta(C, d_k), vbeta(C, d_v);
  Mat kbeta_eg(C, d_k);  // β⊙K⊙e^G
  Mat U(C, d_v), W(C, d_k), vnew(C, d_v), oc(C, d_v);
  Mat qk(C, C);                                         // lower_incl_diag(Q̂ K̂ᵀ ⊙ Γ)
  Mat kdecay(C, d_k);                                   // K̂ ⊙ e^{G_last − G}
  std::vector<float> qdecay(static_cast<size_t>(d_k));  // q̂_t ⊙ e^{G_t}
  std::vector<float> row_copy(static_cast<size_t>(C));
  Mat S(d_k, d_v);  // state, copied in and out of s
  std::copy(s, s + static_cast<size_t>(d_k) * d_v, S.a.begin());

  for (int c0 = 0; c0 < n_tok; c0 += C) {
    const int n = std::min(C, n_tok - c0);
    qc.zero(), kc.zero(), vc.zero();
    std::fill(gc.begin(), gc.end(), 0.0f);
    std::fill(bc.begin(), bc.end(), 0.0f);
    for (int t = 0; t < n; ++t) {
      const size_t tok = static_cast<size_t>(c0 + t);
      std::copy(q + tok * d_k, q + (tok + 1) * d_k, qc.row(t));
      std::copy(k + tok * d_k, k + (tok + 1) * d_k, kc.row(t));
      std::copy(v + tok * d_v, v + (tok + 1) * d_v, vc.row(t));
      gc[static_cast<size_t>(t)] = g[tok];
      bc[static_cast<size_t>(t)] = beta[tok];
    }
    for (int t = 0; t < C; ++t) {
      for (int i = 0; i < d_k; ++i) kbeta(t, i) = kc(t, i) * bc[static_cast<size_t>(t)];
      for (int j = 0; j < d_v; ++j) vbeta(t, j) = vc(t, j) * bc[static_cast<size_t>(t)];
    }

    // G = cumsum(g); Γ_ts = exp(G_t − G_s) on the lower triangle (incl. diagonal) only.
    float acc = 0.0f;
    for (int t = 0; t < C; ++t) {
      acc += gc[static_cast<size_t>(t)];
      G[static_cast<size_t>(t)] = acc;
    }
    for (int t = 0; t < C; ++t) {
      for (int u = 0; u < C; ++u) {
        decay(t, u) = u <= t ? std::exp(G[static_cast<size_t>(t)] - G[static_cast<size_t>(u)]) : 0.0f;
      }
    }

    // A = −strict_lower((β⊙K) Kᵀ ⊙ Γ).
    for (int t = 0; t < C; ++t) {
      for (int u = 0; u < C; ++u) A(t, u) = u < t ? -(dot_f32(kbeta.row(t), kc.row(u), d_k) * decay(t, u)) : 0.0f;
    }
    // Forward substitution (HF): row i ← row + Σ_m row[m]·A[m][:], using the rows already updated.
    for (int i = 1; i < C; ++i) {
      for (int m = 0; m < i; ++m) row_copy[static_cast<size_t>(m)] = A(i, m);
      for (int j = 0; j < i; ++j) {
        float sum = 0.0f;
        for (int m = 0; m < i; ++m) sum += row_copy[static_cast<size_t>(m)] * A(m, j);
        A(i, j) = row_copy[static_cast<size_t>(j)] + sum;
      }
    }
    for (int t = 0; t < C; ++t) A(t, t) += 1.0f;  // T = A + I (unit lower triangular)

    // U = T (β⊙V); W = T (β⊙K⊙e^G). T is lower triangular: columns u > t are exactly zero.
    for (int u = 0; u < C; ++u) {
      const float eg = std::exp(G[static_cast<size_t>(u)]);
      for (int i = 0; i < d_k; ++i) kbeta_eg(u, i) = kbeta(u, i) * eg;
    }
    for (int t = 0; t < C; ++t) {
      for (int j = 0; j < d_v; ++j) {
        float sum = 0.0f;
        for (int u = 0; u <= t; ++u) sum += A(t, u) * vbeta(u, j);
        U(t, j) = sum;
      }
      for (int i = 0; i < d_k; ++i) {
        float sum = 0.0f;
        for (int u = 0; u <= t; ++u) sum += A(t, u) * kbeta_eg(u, i);
        W(t, i) = sum;
      }
    }

    // V' = U − W S.
    for (int t = 0; t < C; ++t) {
      for (int j = 0; j < d_v; ++j) {
        float ws = 0.0f;
        for (int i = 0; i < d_k; ++i) ws += W(t, i) * S(i, j);
        vnew(t, j) = U(t, j) - ws;
      }
    }

    // O = (Q̂⊙e^G) S + lower_incl_diag(Q̂ K̂ᵀ ⊙ Γ) V'.
    for (int t = 0; t < C; ++t) {
      for (int u = 0; u < C; ++u) qk(t, u) = u <= t ? dot_f32(qc.row(t), kc.row(u), d_k) * decay(t, u) : 0.0f;
    }
    for (int t = 0; t < C; ++t) {
      const float eg = std::exp(G[static_cast<size_t>(t)]);
      for (int i = 0; i < d_k; ++i) qdecay[static_cast<size_t>(i)] = qc(t, i) * eg;
      for (int j = 0; j < d_v; ++j) {
        float inter = 0.0f;
        for (int i = 0; i < d_k; ++i) inter += qdecay[static_cast<size_t>(i)] * S(i, j);
        float intra = 0.0f;
        for (int u = 0; u <= t; ++u) intra += qk(t, u) * vnew(u, j);
        oc(t, j) = inter + intra;
      }
    }

    // S ← e^{G_last} S + (K̂ ⊙ e^{G_last − G})ᵀ V'.
    const float g_last = G[static_cast<size_t>(C - 1)];
    const float e_last = std::exp(g_last);
    for (int t = 0; t < C; ++t) {
      const float e = std::exp(g_last - G[static_cast<size_t>(t)]);
      for (int i = 0; i < d_k; ++i) kdecay(t, i) = kc(t, i) * e;
    }
    for (int i = 0; i < d_k; ++i) {
      for (int j = 0; j < d_v; ++j) {
        float upd = 0.0f;
        for (int t = 0; t < C; ++t) upd += kdecay(t, i) * vnew(t, j);
        S(i, j) = S(i, j) * e_last + upd;
      }
    }

    for (int t = 0; t < n; ++t) std::copy(oc.row(t), oc.row(t) + d_v, o + static_cast<size_t>(c0 + t) * d_v);
  }
  std::copy(S.a.begin(), S.a.end(), s);
}

}  // namespace kestrel::ref
