// core/reference GDN layer: chunked prefill ≡ token-by-token recurrence at layer level (outputs, S and conv state),
// grouped vs tiled head mapping under the qwen35 converter's V-head permutation, legacy ssm_in and ssm_ba layouts
// against the split layout with the same underlying weights, and argument checks.
#include <gtest/gtest.h>

#include <vector>

#include "core/reference/gdn_layer.h"
#include "tests/core/reference/ref_test_util.h"

namespace kestrel::ref {
namespace {

using test::F32Weights;
using test::max_rel_diff;
using test::random_vec;

constexpr double kChunkTol = 2e-5;  // chunked vs recurrent, norm-wise relative

// Random f32 weights of one GDN layer in HF (grouped) V-head order, qwen35 split layout.
struct GdnModel {
  GdnDims d;
  F32Weights qkv, gate, beta, alpha, out;
  std::vector<float> conv, dt_bias, ssm_a, norm;

  GdnModel(int H, int Kh, int Vh, int dk, int dv, uint32_t seed, float a_max = 2.0f) {
    d.n_embd = H;
    d.n_k_heads = Kh;
    d.n_v_heads = Vh;
    d.d_k = dk;
    d.d_v = dv;
    d.conv_kernel = 4;
    d.eps = 1e-6f;
    d.mapping = HeadMapping::kGrouped;
    const uint64_t h = static_cast<uint64_t>(H);
    qkv = F32Weights(h, static_cast<uint64_t>(d.conv_dim()), seed, 0.3f);
    gate = F32Weights(h, static_cast<uint64_t>(d.value_dim()), seed + 1, 0.3f);
    beta = F32Weights(h, static_cast<uint64_t>(Vh), seed + 2, 0.3f);
    alpha = F32Weights(h, static_cast<uint64_t>(Vh), seed + 3, 0.3f);
    out = F32Weights(static_cast<uint64_t>(d.value_dim()), h, seed + 4, 0.2f);
    conv = random_vec(static_cast<size_t>(d.conv_dim()) * 4, seed + 5, -0.6f, 0.6f);
    dt_bias = random_vec(static_cast<size_t>(Vh), seed + 6, -1.0f, 1.0f);
    ssm_a = random_vec(static_cast<size_t>(Vh), seed + 7, -a_max, -0.1f);
    norm = random_vec(static_cast<size_t>(dv), seed + 8, 0.5f, 1.5f);
  }

  GdnWeights weights() const {
    GdnWeights w;
    w.dims = d;
    w.projection = GdnProjection::kQkvGateBetaAlpha;
    w.qkv = qkv.view();
    w.gate = gate.view();
    w.beta = beta.view();
    w.alpha = alpha.view();
    w.conv1d = conv.data();
    w.dt_bias = dt_bias.data();
    w.ssm_a = ssm_a.data();
    w.ssm_norm = norm.data();
    w.ssm_out = out.view();
    return w;
  }
};

GdnState random_state(const GdnDims& d, uint32_t seed) {
  GdnState st = GdnState::zeros(d);
  st.s = random_vec(st.s.size(), seed, -0.5f, 0.5f);
  st.conv = random_vec(st.conv.size(), seed + 1, -1.0f, 1.0f);
  return st;
}

struct RunResult {
  std::vector<float> out;
  GdnState state;
};

RunResult run(const GdnWeights& w, GdnState state, const std::vector<float>& x, int T, GdnMode mode) {
  RunResult r{std::vector<float>(static_cast<size_t>(T) * w.dims.n_embd, NAN), std::move(state)};
  const Status s = gdn_forward(w, r.state, x.data(), T, r.out.data(), mode);
  EXPECT_TRUE(s) << (s ? "" : s.error().to_string());
  return r;
}

struct Shape {
  int Kh, Vh;
};

TEST(RefGdnLayer, ChunkedPrefillMatchesRecurrentDecode) {
  const int H = 24, dk = 16, dv = 16;
  for (Shape sh : {Shape{2, 4}, Shape{3, 6}}) {
    for (HeadMapping mapping : {HeadMapping::kGrouped, HeadMapping::kTiled}) {
      GdnModel m(H, sh.Kh, sh.Vh, dk, dv, 1000 + static_cast<uint32_t>(sh.Vh));
      m.d.mapping = mapping;
      const GdnWeights w = m.weights();
      for (int T : {1, 3, 63, 64, 65, 130}) {
        for (bool nonzero : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "Kh=" << sh.Kh << " Vh=" << sh.Vh << " tiled=" << (mapping == HeadMapping::kTiled)
                       << " T=" << T << " nonzero=" << nonzero);
          const auto x = random_vec(static_cast<size_t>(T) * H, 77 + static_cast<uint32_t>(T));
          const GdnState s0 = nonzero ? random_state(m.d, 5 + static_cast<uint32_t>(T)) : GdnState::zeros(m.d);
          const RunResult rec = run(w, s0, x, T, GdnMode::kRecurrent);
          const RunResult chk = run(w, s0, x, T, GdnMode::kChunked);
          EXPECT_LT(max_rel_diff(chk.out, rec.out), kChunkTol);
          EXPECT_LT(max_rel_diff(chk.state.s, rec.state.s), kChunkTol);
          EXPECT_EQ(chk.state.conv, rec.state.conv) << "prefill conv state must equal decode conv state";
        }
      }
    }
  }
}

TEST(RefGdnLayer, StrongDecayAndContinuation) {
  // ssm_a down to −16 (HF init range of A): decays underflow inside a chunk; prefill continued from its own state.
  const int H = 24, T1 = 70, T2 = 9;
  GdnModel m(H, 2, 4, 16, 16, 2000, 16.0f);
  const GdnWeights w = m.weights();
  const auto x = random_vec(static_cast<size_t>(T1 + T2) * H, 2001);
  const std::vector<float> x1(x.begin(), x.begin() + T1 * H), x2(x.begin() + T1 * H, x.end());
  const RunResult all = run(w, random_state(m.d, 2002), x, T1 + T2, GdnMode::kRecurrent);
  const RunResult first = run(w, random_state(m.d, 2002), x1, T1, GdnMode::kChunked);
  const RunResult second = run(w, first.state, x2, T2, GdnMode::kChunked);
  std::vector<float> joined = first.out;
  joined.insert(joined.end(), second.out.begin(), second.out.end());
  EXPECT_LT(max_rel_diff(joined, all.out), kChunkTol);
  EXPECT_LT(max_rel_diff(second.state.s, all.state.s), kChunkTol);
  EXPECT_EQ(second.state.conv, all.state.conv);
}

// qwen35 converter (model-spec §6.3 item 4): new V-head j holds HF head (j % Kh)·r + (j / Kh).
int hf_head(int j, int Kh, int r) { return (j % Kh) * r + (j / Kh); }

GdnModel permute_to_tiled(const GdnModel& m) {
  GdnModel p = m;
  const GdnDims& d = m.d;
  const int Kh = d.n_k_heads, Vh = d.n_v_heads, r = d.v_per_k(), dv = d.d_v, H = d.n_embd, Kd = d.key_dim();
  for (int j = 0; j < Vh; ++j) {
    const int src = hf_head(j, Kh, r);
    for (int e = 0; e < dv; ++e) {
      const int row_new = j * dv + e, row_old = src * dv + e;
      for (int i = 0; i < H; ++i) {
        p.qkv.at(2 * Kd + row_new, i) = m.qkv.at(2 * Kd + row_old, i);  // V rows of attn_qkv
        p.gate.at(row_new, i) = m.gate.at(row_old, i);                  // z rows
      }
      for (int t = 0; t < 4; ++t) p.conv[(2 * Kd + row_new) * 4 + t] = m.conv[(2 * Kd + row_old) * 4 + t];
      for (int o = 0; o < H; ++o) p.out.at(o, row_new) = m.out.at(o, row_old);  // input columns of ssm_out
    }
    for (int i = 0; i < H; ++i) {
      p.beta.at(j, i) = m.beta.at(src, i);
      p.alpha.at(j, i) = m.alpha.at(src, i);
    }
    p.dt_bias[j] = m.dt_bias[src];
    p.ssm_a[j] = m.ssm_a[src];
  }
  p.d.mapping = HeadMapping::kTiled;
  return p;
}

// The same permutation applied to a state (S per V-head, conv V channels).
GdnState permute_state(const GdnState& s, const GdnDims& d) {
  GdnState p = s;
  const int r = d.v_per_k(), hs = d.d_k * d.d_v, K1 = d.conv_kernel - 1, Kd = d.key_dim();
  for (int j = 0; j < d.n_v_heads; ++j) {
    const int src = hf_head(j, d.n_k_heads, r);
    for (int e = 0; e < hs; ++e) p.s[j * hs + e] = s.s[src * hs + e];
    for (int e = 0; e < d.d_v; ++e) {
      for (int t = 0; t < K1; ++t)
        p.conv[(2 * Kd + j * d.d_v + e) * K1 + t] = s.conv[(2 * Kd + src * d.d_v + e) * K1 + t];
    }
  }
  return p;
}

TEST(RefGdnLayer, TiledMappingUndoesTheConverterPermutation) {
  const int H = 24, T = 67;
  for (Shape sh : {Shape{2, 4}, Shape{3, 6}}) {
    SCOPED_TRACE(::testing::Message() << "Kh=" << sh.Kh << " Vh=" << sh.Vh);
    const GdnModel hf(H, sh.Kh, sh.Vh, 16, 16, 3000 + static_cast<uint32_t>(sh.Vh));
    const GdnModel gguf = permute_to_tiled(hf);
    const auto x = random_vec(static_cast<size_t>(T) * H, 3100);
    const GdnState s0 = random_state(hf.d, 3200);
    for (GdnMode mode : {GdnMode::kRecurrent, GdnMode::kChunked}) {
      const RunResult a = run(hf.weights(), s0, x, T, mode);
      const RunResult b = run(gguf.weights(), permute_state(s0, hf.d), x, T, mode);
      // ssm_out sums the same products in another column order: equal to rounding.
      EXPECT_LT(max_rel_diff(b.out, a.out), 1e-6);
      // Per-head state is computed identically: bit-equal after applying the same permutation.
      const GdnState a_perm = permute_state(a.state, hf.d);
      EXPECT_EQ(b.state.s, a_perm.s);
      EXPECT_EQ(b.state.conv, a_perm.conv);
      // The permuted weights read with the grouped mapping are wrong: the test can tell the mappings apart.
      GdnWeights wrong = gguf.weights();
      wrong.dims.mapping = HeadMapping::kGrouped;
      const RunResult c = run(wrong, permute_state(s0, hf.d), x, T, mode);
      EXPECT_GT(max_rel_diff(c.out, a.out), 1e-3);
    }
  }
}

// ssm_ba rows from ssm_beta/ssm_alpha rows: per K-group g, [b(g·r … g·r+r−1), a(g·r … g·r+r−1)].
F32Weights make_ba(const GdnModel& m) {
  const GdnDims& d = m.d;
  const int r = d.v_per_k(), H = d.n_embd;
  F32Weights ba(static_cast<uint64_t>(H), static_cast<uint64_t>(2 * d.n_v_heads), 0);
  for (int g = 0; g < d.n_k_heads; ++g) {
    for (int j = 0; j < r; ++j) {
      for (int i = 0; i < H; ++i) {
        ba.at(g * 2 * r + j, i) = m.beta.at(g * r + j, i);
        ba.at(g * 2 * r + r + j, i) = m.alpha.at(g * r + j, i);
      }
    }
  }
  return ba;
}

// HF in_proj_qkvz rows from attn_qkv/attn_gate rows: per K-group g, [q_g, k_g, v_g (r·dv), z_g (r·dv)].
F32Weights make_ssm_in(const GdnModel& m) {
  const GdnDims& d = m.d;
  const int dk = d.d_k, rdv = d.v_per_k() * d.d_v, Kd = d.key_dim(), H = d.n_embd;
  F32Weights in(static_cast<uint64_t>(H), static_cast<uint64_t>(d.conv_dim() + d.value_dim()), 0);
  for (int g = 0; g < d.n_k_heads; ++g) {
    const int base = g * (2 * dk + 2 * rdv);
    for (int i = 0; i < H; ++i) {
      for (int e = 0; e < dk; ++e) in.at(base + e, i) = m.qkv.at(g * dk + e, i);
      for (int e = 0; e < dk; ++e) in.at(base + dk + e, i) = m.qkv.at(Kd + g * dk + e, i);
      for (int e = 0; e < rdv; ++e) in.at(base + 2 * dk + e, i) = m.qkv.at(2 * Kd + g * rdv + e, i);
      for (int e = 0; e < rdv; ++e) in.at(base + 2 * dk + rdv + e, i) = m.gate.at(g * rdv + e, i);
    }
  }
  return in;
}

TEST(RefGdnLayer, Qwen3NextLayoutsMatchSplitLayout) {
  const int H = 24, T = 5;
  for (Shape sh : {Shape{2, 4}, Shape{3, 6}}) {
    SCOPED_TRACE(::testing::Message() << "Kh=" << sh.Kh << " Vh=" << sh.Vh);
    const GdnModel m(H, sh.Kh, sh.Vh, 16, 16, 4000 + static_cast<uint32_t>(sh.Vh));
    const F32Weights ba = make_ba(m), ssm_in = make_ssm_in(m);
    const auto x = random_vec(static_cast<size_t>(T) * H, 4100);
    const GdnState s0 = random_state(m.d, 4200);

    const RunResult split = run(m.weights(), s0, x, T, GdnMode::kRecurrent);

    GdnWeights w_ba = m.weights();
    w_ba.projection = GdnProjection::kQkvGateBa;
    w_ba.beta = w_ba.alpha = QuantMatrix{};
    w_ba.ba = ba.view();
    const RunResult fused_ba = run(w_ba, s0, x, T, GdnMode::kRecurrent);
    EXPECT_EQ(fused_ba.out, split.out);
    EXPECT_EQ(fused_ba.state.s, split.state.s);

    GdnWeights w_legacy = w_ba;
    w_legacy.projection = GdnProjection::kSsmInBa;
    w_legacy.qkv = w_legacy.gate = QuantMatrix{};
    w_legacy.ssm_in = ssm_in.view();
    const RunResult legacy = run(w_legacy, s0, x, T, GdnMode::kRecurrent);
    EXPECT_EQ(legacy.out, split.out);
    EXPECT_EQ(legacy.state.s, split.state.s);
    EXPECT_EQ(legacy.state.conv, split.state.conv);
  }
}

TEST(RefGdnLayer, DimsAndProjectionFromHparams) {
  ModelHparams hp;  // Qwen3.5-27B GDN sizes (model-spec §1)
  hp.arch = Arch::kQwen35;
  hp.n_embd = 5120;
  hp.ssm_n_k_heads = 16;
  hp.ssm_n_v_heads = 48;
  hp.ssm_d_state = 128;
  hp.ssm_inner = 6144;
  hp.ssm_conv_kernel = 4;
  hp.rms_eps = 1e-6f;
  const GdnDims d = GdnDims::from_hparams(hp);
  EXPECT_EQ(d.n_embd, 5120);
  EXPECT_EQ(d.v_per_k(), 3);
  EXPECT_EQ(d.d_v, 128);
  EXPECT_EQ(d.conv_dim(), 10240);
  EXPECT_EQ(d.mapping, HeadMapping::kTiled);
  EXPECT_TRUE(d.validate());
  EXPECT_EQ(gdn_k_head(d, 17), 1);  // tiled: 17 % 16
  hp.arch = Arch::kQwen3Next;
  EXPECT_EQ(GdnDims::from_hparams(hp).mapping, HeadMapping::kGrouped);
  EXPECT_EQ(gdn_k_head(GdnDims::from_hparams(hp), 17), 5);  // grouped: 17 / 3
  EXPECT_EQ(gdn_projection_for(Arch::kQwen35Moe, GdnInputLayout::kSplit), GdnProjection::kQkvGateBetaAlpha);
  EXPECT_EQ(gdn_projection_for(Arch::kQwen3Next, GdnInputLayout::kSplit), GdnProjection::kQkvGateBa);
  EXPECT_EQ(gdn_projection_for(Arch::kQwen3Next, GdnInputLayout::kLegacySsmIn), GdnProjection::kSsmInBa);
}

TEST(RefGdnLayer, ArgumentChecks) {
  const GdnModel m(24, 2, 4, 16, 16, 5000);
  GdnState st = GdnState::zeros(m.d);
  const auto x = random_vec(24, 5001);
  std::vector<float> out(24);

  GdnWeights w = m.weights();
  w.gate.n_out = 63;
  Status s = gdn_forward(w, st, x.data(), 1, out.data(), GdnMode::kRecurrent);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("attn_gate"), std::string::npos) << s.error().message;

  w = m.weights();
  w.projection = GdnProjection::kQkvGateBa;  // ssm_ba not provided
  s = gdn_forward(w, st, x.data(), 1, out.data(), GdnMode::kRecurrent);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("ssm_ba"), std::string::npos) << s.error().message;

  GdnDims other = m.d;
  other.n_v_heads = 6;
  GdnState wrong_state = GdnState::zeros(other);
  s = gdn_forward(m.weights(), wrong_state, x.data(), 1, out.data(), GdnMode::kChunked);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  w = m.weights();
  w.dims.n_v_heads = 5;  // not a multiple of Kh
  s = gdn_forward(w, st, x.data(), 1, out.data(), GdnMode::kRecurrent);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("multiple"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace kestrel::ref
