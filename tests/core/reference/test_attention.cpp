// core/reference gated attention: against a naive full-matrix implementation written here in double (GQA, partial
// NeoX RoPE, [q|gate] packing, causal mask), prefill ≡ single-token decode steps, and cache/position checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/reference/attention.h"
#include "tests/core/reference/ref_test_util.h"

namespace kestrel::ref {
namespace {

using test::F32Weights;
using test::max_rel_diff;
using test::random_vec;

struct AttnModel {
  AttnDims d;
  F32Weights q, k, v, o;
  std::vector<float> q_norm, k_norm;

  AttnModel(int H, int n_head, int n_kv, int hd, int n_rot, uint32_t seed) {
    d.n_embd = H;
    d.n_head = n_head;
    d.n_head_kv = n_kv;
    d.head_dim = hd;
    d.n_rot = n_rot;
    d.freq_base = 10000.0f;
    d.eps = 1e-6f;
    const auto h = static_cast<uint64_t>(H);
    q = F32Weights(h, static_cast<uint64_t>(n_head * 2 * hd), seed, 0.4f);
    k = F32Weights(h, static_cast<uint64_t>(n_kv * hd), seed + 1, 0.4f);
    v = F32Weights(h, static_cast<uint64_t>(n_kv * hd), seed + 2, 0.4f);
    o = F32Weights(static_cast<uint64_t>(n_head * hd), h, seed + 3, 0.3f);
    q_norm = random_vec(static_cast<size_t>(hd), seed + 4, 0.5f, 1.5f);
    k_norm = random_vec(static_cast<size_t>(hd), seed + 5, 0.5f, 1.5f);
  }
  AttnWeights weights() const {
    return AttnWeights{d, q.view(), k.view(), v.view(), o.view(), q_norm.data(), k_norm.data()};
  }
};

// Independent double-precision implementation of model-spec §4 over a whole sequence of T tokens from position 0.
std::vector<float> naive_attention(const AttnModel& m, const std::vector<float>& x, int T) {
  const AttnDims& d = m.d;
  const int H = d.n_embd, hd = d.head_dim, nh = d.n_head, nkv = d.n_head_kv, half = d.n_rot / 2;
  auto proj = [&](const F32Weights& w, const double* in, int n_in, int row) {
    double acc = 0.0;
    for (int i = 0; i < n_in; ++i) acc += static_cast<double>(w.at(row, i)) * in[i];
    return acc;
  };
  auto rms = [&](std::vector<double>& vec, const std::vector<float>& w) {
    double ss = 0.0;
    for (double e : vec) ss += e * e;
    const double inv = 1.0 / std::sqrt(ss / hd + d.eps);
    for (int i = 0; i < hd; ++i) vec[i] = vec[i] * inv * w[i];
  };
  auto rope = [&](std::vector<double>& vec, int pos) {
    for (int i = 0; i < half; ++i) {
      const double theta = pos * std::pow(static_cast<double>(d.freq_base), -2.0 * i / d.n_rot);
      const double a = vec[i], b = vec[i + half];
      vec[i] = a * std::cos(theta) - b * std::sin(theta);
      vec[i + half] = a * std::sin(theta) + b * std::cos(theta);
    }
  };
  // Q [T][nh][hd], G (gates), K/V [T][nkv][hd].
  std::vector<std::vector<double>> Q(T * nh), G(T * nh), K(T * nkv), V(T * nkv);
  for (int t = 0; t < T; ++t) {
    std::vector<double> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    for (int h = 0; h < nh; ++h) {
      Q[t * nh + h].resize(hd);
      G[t * nh + h].resize(hd);
      for (int i = 0; i < hd; ++i) {
        Q[t * nh + h][i] = proj(m.q, xt.data(), H, h * 2 * hd + i);
        G[t * nh + h][i] = proj(m.q, xt.data(), H, h * 2 * hd + hd + i);
      }
      rms(Q[t * nh + h], m.q_norm);
      rope(Q[t * nh + h], t);
    }
    for (int j = 0; j < nkv; ++j) {
      K[t * nkv + j].resize(hd);
      V[t * nkv + j].resize(hd);
      for (int i = 0; i < hd; ++i) {
        K[t * nkv + j][i] = proj(m.k, xt.data(), H, j * hd + i);
        V[t * nkv + j][i] = proj(m.v, xt.data(), H, j * hd + i);
      }
      rms(K[t * nkv + j], m.k_norm);
      rope(K[t * nkv + j], t);
    }
  }
  // Full score matrix per head with a causal mask, softmax over each row.
  std::vector<float> out(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t) {
    std::vector<double> cat(static_cast<size_t>(nh) * hd);
    for (int h = 0; h < nh; ++h) {
      const int kv = h / (nh / nkv);
      std::vector<double> scores(T, -INFINITY);
      for (int s = 0; s < T; ++s) {
        if (s > t) continue;  // causal
        double dot = 0.0;
        for (int i = 0; i < hd; ++i) dot += Q[t * nh + h][i] * K[s * nkv + kv][i];
        scores[s] = dot / std::sqrt(static_cast<double>(hd));
      }
      double mx = -INFINITY, sum = 0.0;
      for (double sc : scores) mx = std::max(mx, sc);
      for (double& sc : scores) sum += (sc = std::exp(sc - mx));
      for (int i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (int s = 0; s < T; ++s) acc += scores[s] / sum * V[s * nkv + kv][i];
        cat[h * hd + i] = acc / (1.0 + std::exp(-G[t * nh + h][i]));
      }
    }
    for (int o = 0; o < H; ++o) out[t * H + o] = static_cast<float>(proj(m.o, cat.data(), nh * hd, o));
  }
  return out;
}

TEST(RefAttention, MatchesNaiveFullMatrixImplementation) {
  struct Case {
    int n_head, n_kv, hd, n_rot;
  };
  for (Case c : {Case{4, 2, 32, 8}, Case{6, 2, 16, 16}, Case{3, 3, 24, 12}, Case{4, 1, 16, 0}}) {
    SCOPED_TRACE(::testing::Message() << "n_head=" << c.n_head << " n_kv=" << c.n_kv << " hd=" << c.hd
                                      << " n_rot=" << c.n_rot);
    const int H = 20, T = 13;
    const AttnModel m(H, c.n_head, c.n_kv, c.hd, c.n_rot, 10 + static_cast<uint32_t>(c.hd));
    const auto x = random_vec(static_cast<size_t>(T) * H, 11);
    auto cache = KvCache::make(32, c.n_kv, c.hd);
    ASSERT_TRUE(cache);
    std::vector<float> out(static_cast<size_t>(T) * H);
    // Two batches (7 + 6): the second one attends to the cache the first one filled.
    ASSERT_TRUE(attn_forward(m.weights(), *cache, x.data(), 7, 0, out.data()));
    ASSERT_TRUE(attn_forward(m.weights(), *cache, x.data() + 7 * H, 6, 7, out.data() + 7 * H));
    EXPECT_EQ(cache->n_used, T);
    EXPECT_LT(max_rel_diff(out, naive_attention(m, x, T)), 2e-5);
  }
}

TEST(RefAttention, PrefillEqualsDecodeSteps) {
  const int H = 20, T = 9;
  const AttnModel m(H, 4, 2, 16, 8, 20);
  const auto x = random_vec(static_cast<size_t>(T) * H, 21);
  auto c1 = KvCache::make(16, 2, 16);
  auto c2 = KvCache::make(16, 2, 16);
  ASSERT_TRUE(c1 && c2);
  std::vector<float> prefill(T * H), decode(T * H);
  ASSERT_TRUE(attn_forward(m.weights(), *c1, x.data(), T, 0, prefill.data()));
  for (int t = 0; t < T; ++t)
    ASSERT_TRUE(attn_forward(m.weights(), *c2, x.data() + t * H, 1, t, decode.data() + t * H));
  EXPECT_EQ(prefill, decode);
  EXPECT_EQ(c1->k, c2->k);
  EXPECT_EQ(c1->v, c2->v);
}

TEST(RefAttention, OutputGateAndCausality) {
  // The first token attends only to itself: its output must not change when later tokens change.
  const int H = 20;
  const AttnModel m(H, 4, 2, 16, 8, 30);
  auto x = random_vec(static_cast<size_t>(3) * H, 31);
  std::vector<float> a(3 * H), b(3 * H);
  auto c1 = KvCache::make(4, 2, 16);
  auto c2 = KvCache::make(4, 2, 16);
  ASSERT_TRUE(attn_forward(m.weights(), *c1, x.data(), 3, 0, a.data()));
  for (int i = H; i < 3 * H; ++i) x[i] += 0.5f;
  ASSERT_TRUE(attn_forward(m.weights(), *c2, x.data(), 3, 0, b.data()));
  for (int i = 0; i < H; ++i) EXPECT_EQ(a[i], b[i]);
  EXPECT_GT(max_rel_diff(std::vector<float>(a.begin() + H, a.end()), std::vector<float>(b.begin() + H, b.end())), 1e-3);
}

TEST(RefAttention, DimsFromHparams) {
  ModelHparams hp;  // Qwen3.5-35B-A3B attention sizes (model-spec §1)
  hp.n_embd = 2048;
  hp.n_head = 16;
  hp.n_head_kv = 2;
  hp.head_dim = 256;
  hp.n_rot = 64;
  hp.rope_freq_base = 1e7f;
  hp.rms_eps = 1e-6f;
  const AttnDims d = AttnDims::from_hparams(hp);
  EXPECT_EQ(d.n_head, 16);
  EXPECT_EQ(d.n_head_kv, 2);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.n_rot, 64);
  EXPECT_EQ(d.freq_base, 1e7f);
  EXPECT_TRUE(d.validate());
}

TEST(RefAttention, CacheAndPositionChecks) {
  const int H = 20;
  const AttnModel m(H, 4, 2, 16, 8, 40);
  const auto x = random_vec(static_cast<size_t>(4) * H, 41);
  std::vector<float> out(4 * H);
  auto cache = KvCache::make(3, 2, 16);
  ASSERT_TRUE(cache);
  // Position must follow the cache.
  Status s = attn_forward(m.weights(), *cache, x.data(), 1, 2, out.data());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kFailedPrecondition);
  // Overflow is refused before anything is written.
  s = attn_forward(m.weights(), *cache, x.data(), 4, 0, out.data());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(cache->n_used, 0);
  // Cache made for another geometry.
  auto other = KvCache::make(8, 1, 16);
  s = attn_forward(m.weights(), *other, x.data(), 1, 0, out.data());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  // q projection without the gate half ([q|gate] per head means n_head·2·hd rows).
  AttnWeights w = m.weights();
  w.q.n_out = 4 * 16;
  s = attn_forward(w, *cache, x.data(), 1, 0, out.data());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("attn_q"), std::string::npos);
  EXPECT_FALSE(KvCache::make(0, 2, 16));
}

}  // namespace
}  // namespace kestrel::ref
