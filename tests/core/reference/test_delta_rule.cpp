// core/reference GDN per-token pieces: the recurrent delta-rule step (hand-computed case), chunked prefill against
// token-by-token recurrence (outputs and final state, from zero and non-zero states), causal conv prefill against
// decode steps (incl. T < K−1), gates and the q/k preparation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/reference/delta_rule.h"
#include "core/reference/gdn_conv.h"
#include "core/reference/gdn_prepare.h"
#include "core/reference/norm.h"
#include "tests/core/reference/ref_test_util.h"

namespace kestrel::ref {
namespace {

using test::max_rel_diff;
using test::random_vec;

// Chunked and recurrent forms are algebraically equal; in f32 they differ by rounding. Norm-wise relative bound.
constexpr double kChunkTol = 2e-5;

TEST(RefDeltaRule, StepHandComputed) {
  // dk = dv = 1, k = 1: S' = e^g·S + β·(v − e^g·S); o = S'·q.
  float s = 2.0f;
  float o = 0.0f;
  const float q = 0.5f, k = 1.0f, v = 3.0f, g = -0.5f, beta = 0.25f;
  delta_rule_step(&q, &k, &v, g, beta, 1, 1, &s, &o);
  const double decayed = std::exp(-0.5) * 2.0;
  const double want_s = decayed + 0.25 * (3.0 - decayed);
  EXPECT_NEAR(s, want_s, 1e-6);
  EXPECT_NEAR(o, 0.5 * want_s, 1e-6) << "output must read the updated state";
}

TEST(RefDeltaRule, StepOuterProductLayout) {
  // dk = 2, dv = 3, S = 0, g = 0, β = 1: S' = k vᵀ (S[i][j] = k_i v_j), o_j = Σ_i S'[i][j] q_i = (q·k) v_j.
  std::vector<float> s(6, 0.0f), o(3);
  const std::vector<float> q = {1.0f, 2.0f}, k = {0.5f, -1.0f}, v = {1.0f, 2.0f, 3.0f};
  delta_rule_step(q.data(), k.data(), v.data(), 0.0f, 1.0f, 2, 3, s.data(), o.data());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(s[i * 3 + j], k[i] * v[j]);
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(o[j], (1.0f * 0.5f + 2.0f * -1.0f) * v[j]);
}

struct HeadInputs {
  std::vector<float> q, k, v, g, beta;  // f32 [T, dk], [T, dk], [T, dv], [T], [T]
};

HeadInputs make_inputs(int T, int dk, int dv, uint32_t seed, float g_lo, float g_hi) {
  HeadInputs in;
  in.q = random_vec(static_cast<size_t>(T) * dk, seed);
  in.k = random_vec(static_cast<size_t>(T) * dk, seed + 1);
  in.v = random_vec(static_cast<size_t>(T) * dv, seed + 2, -2.0f, 2.0f);
  in.g = random_vec(static_cast<size_t>(T), seed + 3, g_lo, g_hi);
  in.beta = random_vec(static_cast<size_t>(T), seed + 4, 0.0f, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int t = 0; t < T; ++t) {
    l2_norm(&in.q[t * dk], dk, kL2NormEps, &in.q[t * dk]);
    for (int i = 0; i < dk; ++i) in.q[t * dk + i] *= scale;
    l2_norm(&in.k[t * dk], dk, kL2NormEps, &in.k[t * dk]);
  }
  return in;
}

void run_recurrent(const HeadInputs& in, int T, int dk, int dv, std::vector<float>& s, std::vector<float>& o) {
  o.assign(static_cast<size_t>(T) * dv, 0.0f);
  for (int t = 0; t < T; ++t) {
    delta_rule_step(&in.q[t * dk], &in.k[t * dk], &in.v[t * dv], in.g[t], in.beta[t], dk, dv, s.data(), &o[t * dv]);
  }
}

TEST(RefDeltaRule, ChunkedMatchesRecurrent) {
  const int dk = 16, dv = 16;
  for (int T : {1, 3, 63, 64, 65, 130}) {
    for (bool nonzero_state : {false, true}) {
      for (auto [g_lo, g_hi] : {std::pair{-1.0f, -0.01f}, std::pair{-20.0f, -2.0f}}) {
        SCOPED_TRACE(::testing::Message()
                     << "T=" << T << " nonzero_state=" << nonzero_state << " g in [" << g_lo << ", " << g_hi << "]");
        const HeadInputs in = make_inputs(T, dk, dv, 100 + T, g_lo, g_hi);
        const std::vector<float> s0 =
            nonzero_state ? random_vec(dk * dv, 7 + T, -1.0f, 1.0f) : std::vector<float>(dk * dv, 0.0f);
        std::vector<float> s_rec = s0, s_chk = s0, o_rec, o_chk(static_cast<size_t>(T) * dv, NAN);
        run_recurrent(in, T, dk, dv, s_rec, o_rec);
        delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, dk, dv, s_chk.data(),
                           o_chk.data());
        EXPECT_LT(max_rel_diff(o_chk, o_rec), kChunkTol);
        EXPECT_LT(max_rel_diff(s_chk, s_rec), kChunkTol);
      }
    }
  }
}

TEST(RefDeltaRule, ChunkSizeDoesNotChangeTheResult) {
  const int dk = 8, dv = 12, T = 37;
  const HeadInputs in = make_inputs(T, dk, dv, 55, -2.0f, -0.05f);
  const auto s0 = random_vec(dk * dv, 56);
  std::vector<float> s64 = s0, s5 = s0, o64(T * dv), o5(T * dv);
  delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, dk, dv, s64.data(),
                     o64.data());
  delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, dk, dv, s5.data(),
                     o5.data(), 5);
  EXPECT_LT(max_rel_diff(o5, o64), kChunkTol);
  EXPECT_LT(max_rel_diff(s5, s64), kChunkTol);
  // Prefill in two pieces (a continuation from the state the first piece left) ≡ one piece.
  std::vector<float> s_split = s0, o_split(T * dv);
  const int first = 20;
  delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), first, dk, dv, s_split.data(),
                     o_split.data());
  delta_rule_chunked(in.q.data() + first * dk, in.k.data() + first * dk, in.v.data() + first * dv, in.g.data() + first,
                     in.beta.data() + first, T - first, dk, dv, s_split.data(), o_split.data() + first * dv);
  EXPECT_LT(max_rel_diff(o_split, o64), kChunkTol);
  EXPECT_LT(max_rel_diff(s_split, s64), kChunkTol);
}

TEST(RefDeltaRule, RecurrenceActuallyDependsOnTheState) {
  // Guards the equivalence tests against a degenerate pass: a different initial state changes the outputs.
  const int dk = 16, dv = 16, T = 10;
  const HeadInputs in = make_inputs(T, dk, dv, 9, -0.5f, -0.01f);
  std::vector<float> s_a(dk * dv, 0.0f), s_b = random_vec(dk * dv, 10), o_a, o_b;
  run_recurrent(in, T, dk, dv, s_a, o_a);
  run_recurrent(in, T, dk, dv, s_b, o_b);
  EXPECT_GT(max_rel_diff(o_a, o_b), 1e-2);
}

TEST(RefGdnConv, PrefillMatchesDecodeSteps) {
  const int C = 7, K = 4;
  const auto w = random_vec(C * K, 20);
  for (int T : {1, 2, 3, 5, 9}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const auto x = random_vec(static_cast<size_t>(T) * C, 21 + T);
    const auto state0 = random_vec(C * (K - 1), 40 + T);
    std::vector<float> st_pre = state0, st_dec = state0, u_pre(T * C), u_dec(T * C);
    gdn_conv_prefill(w.data(), C, K, x.data(), T, st_pre.data(), u_pre.data());
    for (int t = 0; t < T; ++t) gdn_conv_step(w.data(), C, K, &x[t * C], st_dec.data(), &u_dec[t * C]);
    EXPECT_EQ(u_pre, u_dec);
    EXPECT_EQ(st_pre, st_dec);
    // The new state is the last K−1 raw inputs of [state, x], oldest first (older state columns for T < K−1).
    for (int c = 0; c < C; ++c) {
      for (int i = 0; i < K - 1; ++i) {
        const int src = T + i;  // index into the window [state(K−1), x(0..T−1)]
        const float want = src < K - 1 ? state0[c * (K - 1) + src] : x[(src - (K - 1)) * C + c];
        EXPECT_EQ(st_pre[c * (K - 1) + i], want) << "c=" << c << " i=" << i;
      }
    }
  }
}

TEST(RefGdnConv, TapOrder) {
  // One channel, K = 4, state [1, 2, 3] (oldest first), x = 4: y = w0·1 + w1·2 + w2·3 + w3·4; w3 hits the current
  // token.
  const std::vector<float> w = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<float> st = {1.0f, 2.0f, 3.0f};
  const float x = 4.0f;
  float u = 0.0f;
  gdn_conv_step(w.data(), 1, 4, &x, st.data(), &u);
  const double y = 0.1 * 1 + 0.2 * 2 + 0.3 * 3 + 0.4 * 4;
  EXPECT_NEAR(u, y / (1.0 + std::exp(-y)), 1e-6);
  EXPECT_EQ(st, (std::vector<float>{2.0f, 3.0f, 4.0f}));
}

TEST(RefGdnPrepare, Gates) {
  const std::vector<float> b = {0.0f, 2.0f, -1.0f}, a = {0.5f, 30.0f, -3.0f};
  const std::vector<float> dt_bias = {0.25f, 1.0f, 0.0f}, ssm_a = {-1.0f, -0.5f, -16.0f};
  std::vector<float> beta(3), g(3);
  gdn_gates(b.data(), a.data(), dt_bias.data(), ssm_a.data(), 3, beta.data(), g.data());
  for (int h = 0; h < 3; ++h) {
    EXPECT_NEAR(beta[h], 1.0 / (1.0 + std::exp(-static_cast<double>(b[h]))), 1e-7);
    const double xa = static_cast<double>(a[h]) + dt_bias[h];
    const double sp = xa > 20.0 ? xa : std::log1p(std::exp(xa));
    EXPECT_NEAR(g[h], ssm_a[h] * sp, 1e-6 * std::abs(ssm_a[h] * sp));
    EXPECT_LE(g[h], 0.0f);
  }
  EXPECT_EQ(g[1], -0.5f * 31.0f) << "softplus above the threshold 20 is the identity";
}

TEST(RefGdnPrepare, SplitNormalisesAndScalesQOnly) {
  GdnDims d;
  d.n_embd = 8;
  d.n_k_heads = 2;
  d.n_v_heads = 4;
  d.d_k = 16;
  d.d_v = 8;
  const auto u = random_vec(static_cast<size_t>(d.conv_dim()), 30);
  std::vector<float> q(d.key_dim()), k(d.key_dim()), v(d.value_dim());
  gdn_split_qkv(d, u.data(), q.data(), k.data(), v.data());
  for (int h = 0; h < d.n_k_heads; ++h) {
    double qn = 0, kn = 0, qdir = 0;
    for (int i = 0; i < d.d_k; ++i) {
      qn += static_cast<double>(q[h * 16 + i]) * q[h * 16 + i];
      kn += static_cast<double>(k[h * 16 + i]) * k[h * 16 + i];
      qdir += static_cast<double>(q[h * 16 + i]) * u[h * 16 + i];
    }
    EXPECT_NEAR(std::sqrt(qn), 1.0 / 4.0, 1e-6) << "q̂ scaled by 1/sqrt(16)";
    EXPECT_NEAR(std::sqrt(kn), 1.0, 1e-6) << "k̂ not scaled";
    EXPECT_GT(qdir, 0.0) << "q̂ points along the q channels of u";
  }
  for (int i = 0; i < d.value_dim(); ++i) EXPECT_EQ(v[i], u[2 * d.key_dim() + i]);
}

}  // namespace
}  // namespace kestrel::ref
