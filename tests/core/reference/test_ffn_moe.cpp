// core/reference FFN: routing on hand-made logits (softmax first, top-k, ties to the lower index, renormalisation
// and its clamp), MoE and dense SwiGLU against naive double implementations written here, the shared-expert gate,
// batch invariance, and quantized expert stacks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/quant/quant.h"
#include "core/reference/ffn.h"
#include "core/reference/moe.h"
#include "tests/core/reference/ref_test_util.h"

namespace kestrel::ref {
namespace {

using test::F32Weights;
using test::max_rel_diff;
using test::random_vec;

std::vector<double> softmax_d(const std::vector<float>& l) {
  double mx = -INFINITY, sum = 0.0;
  for (float v : l) mx = std::max(mx, static_cast<double>(v));
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) sum += (p[i] = std::exp(l[i] - mx));
  for (double& v : p) v /= sum;
  return p;
}

TEST(RefMoeRoute, SoftmaxFirstTopKAndTies) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};
  const auto p = softmax_d(logits);
  int32_t ids[4];
  float w[4];
  moe_route(logits.data(), 5, 2, ids, w);
  EXPECT_EQ(ids[0], 1);  // tie between experts 1 and 3: the lower index comes first
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], 0.5, 1e-7);
  EXPECT_NEAR(w[1], 0.5, 1e-7);
  moe_route(logits.data(), 5, 3, ids, w);
  EXPECT_EQ(ids[2], 2);
  const double mass = p[1] + p[3] + p[2];
  EXPECT_NEAR(w[0], p[1] / mass, 1e-6);
  EXPECT_NEAR(w[2], p[2] / mass, 1e-6);
  // All equal: the k lowest indices.
  const std::vector<float> flat(6, 0.25f);
  moe_route(flat.data(), 6, 4, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids[2], 2);
}

TEST(RefMoeRoute, WeightSumClamp) {
  // 20000 equal experts, k = 1: the selected mass 5e-5 is below 2^-14, so w = 5e-5 / 2^-14 (llama.cpp), not 1.
  const std::vector<float> logits(20000, 0.0f);
  int32_t id;
  float w;
  moe_route(logits.data(), 20000, 1, &id, &w);
  EXPECT_EQ(id, 0);
  EXPECT_NEAR(w, (1.0 / 20000) / 6.103515625e-5, 1e-4);
}

struct MoeModel {
  int H, I, Is, E, k;
  F32Weights router, gate_e, up_e, down_e, sh_gate_inp, gate_s, up_s, down_s;

  MoeModel(int h, int i, int is, int e, int kk, uint32_t seed) : H(h), I(i), Is(is), E(e), k(kk) {
    const auto uh = static_cast<uint64_t>(h), ui = static_cast<uint64_t>(i), ue = static_cast<uint64_t>(e);
    router = F32Weights(uh, ue, seed, 1.0f);
    gate_e = F32Weights(uh, ui * ue, seed + 1, 0.4f);  // {H, I, E} stored as E·I rows of H
    up_e = F32Weights(uh, ui * ue, seed + 2, 0.4f);
    down_e = F32Weights(ui, uh * ue, seed + 3, 0.4f);  // {I, H, E}
    sh_gate_inp = F32Weights(uh, 1, seed + 4, 0.5f);
    gate_s = F32Weights(uh, static_cast<uint64_t>(is), seed + 5, 0.4f);
    up_s = F32Weights(uh, static_cast<uint64_t>(is), seed + 6, 0.4f);
    down_s = F32Weights(static_cast<uint64_t>(is), uh, seed + 7, 0.4f);
  }
  MoeWeights weights(bool shared = true) const {
    MoeWeights w;
    w.n_expert_used = k;
    w.router = router.view();
    auto stack = [&](const F32Weights& m, uint64_t n_in, uint64_t n_out) {
      return QuantExperts{GgmlType::kF32, reinterpret_cast<const uint8_t*>(m.w.data()), n_in, n_out,
                          static_cast<uint64_t>(E)};
    };
    w.gate_exps = stack(gate_e, H, I);
    w.up_exps = stack(up_e, H, I);
    w.down_exps = stack(down_e, I, H);
    if (shared) {
      w.shared_gate_inp = sh_gate_inp.view();
      w.gate_shexp = gate_s.view();
      w.up_shexp = up_s.view();
      w.down_shexp = down_s.view();
    }
    return w;
  }
};

// y = down(silu(gate x) ⊙ up x) in double; rows of gate/up start at row0, rows of down at down_row0.
std::vector<double> naive_swiglu(const F32Weights& gate, const F32Weights& up, const F32Weights& down, int row0,
                                 int down_row0, int I, int H, const float* x) {
  std::vector<double> hmid(I), y(H, 0.0);
  for (int j = 0; j < I; ++j) {
    double g = 0, u = 0;
    for (int i = 0; i < H; ++i) {
      g += static_cast<double>(gate.at(row0 + j, i)) * x[i];
      u += static_cast<double>(up.at(row0 + j, i)) * x[i];
    }
    hmid[j] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int o = 0; o < H; ++o)
    for (int j = 0; j < I; ++j) y[o] += static_cast<double>(down.at(down_row0 + o, j)) * hmid[j];
  return y;
}

TEST(RefMoe, MatchesNaiveImplementation) {
  const MoeModel m(16, 8, 12, 6, 2, 50);
  const int T = 5;
  const auto x = random_vec(static_cast<size_t>(T) * m.H, 51);
  std::vector<float> out(T * m.H);
  std::vector<int32_t> sel(T * m.k);
  ASSERT_TRUE(moe_forward(m.weights(), x.data(), T, out.data(), sel.data()));
  std::vector<float> want(T * m.H);
  for (int t = 0; t < T; ++t) {
    const float* xt = x.data() + t * m.H;
    std::vector<float> logits(m.E);
    for (int e = 0; e < m.E; ++e) {
      double acc = 0;
      for (int i = 0; i < m.H; ++i) acc += static_cast<double>(m.router.at(e, i)) * xt[i];
      logits[e] = static_cast<float>(acc);
    }
    const auto p = softmax_d(logits);
    std::vector<int> order(m.E);
    for (int e = 0; e < m.E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double mass = 0;
    for (int j = 0; j < m.k; ++j) mass += p[order[j]];
    std::vector<double> y(m.H, 0.0);
    for (int j = 0; j < m.k; ++j) {
      const int e = order[j];
      EXPECT_EQ(sel[t * m.k + j], e) << "token " << t;
      const auto ye = naive_swiglu(m.gate_e, m.up_e, m.down_e, e * m.I, e * m.H, m.I, m.H, xt);
      for (int o = 0; o < m.H; ++o) y[o] += p[e] / mass * ye[o];
    }
    double sg = 0;
    for (int i = 0; i < m.H; ++i) sg += static_cast<double>(m.sh_gate_inp.at(0, i)) * xt[i];
    const auto ys = naive_swiglu(m.gate_s, m.up_s, m.down_s, 0, 0, m.Is, m.H, xt);
    for (int o = 0; o < m.H; ++o) want[t * m.H + o] = static_cast<float>(y[o] + ys[o] / (1.0 + std::exp(-sg)));
  }
  EXPECT_LT(max_rel_diff(out, want), 1e-5);
}

TEST(RefMoe, SharedExpertGateScalesTheSharedExpert) {
  MoeModel m(16, 8, 12, 6, 2, 60);
  const auto x = random_vec(static_cast<size_t>(m.H), 61);
  std::vector<float> routed(m.H), with_shared(m.H), off(m.H);
  ASSERT_TRUE(moe_forward(m.weights(false), x.data(), 1, routed.data()));
  ASSERT_TRUE(moe_forward(m.weights(true), x.data(), 1, with_shared.data()));
  // Shared expert alone, times sigmoid(w·x).
  std::vector<float> sh(m.H);
  ASSERT_TRUE(swiglu_forward(m.gate_s.view(), m.up_s.view(), m.down_s.view(), x.data(), 1, sh.data()));
  double sg = 0;
  for (int i = 0; i < m.H; ++i) sg += static_cast<double>(m.sh_gate_inp.at(0, i)) * x[i];
  const double s = 1.0 / (1.0 + std::exp(-sg));
  for (int o = 0; o < m.H; ++o) EXPECT_NEAR(with_shared[o] - routed[o], s * sh[o], 1e-5);
  // A gate driven far negative switches the shared expert off.
  for (int i = 0; i < m.H; ++i) m.sh_gate_inp.at(0, i) = x[i] >= 0 ? -100.0f : 100.0f;
  ASSERT_TRUE(moe_forward(m.weights(true), x.data(), 1, off.data()));
  EXPECT_LT(max_rel_diff(off, routed), 1e-12);
}

TEST(RefMoe, BatchInvariant) {
  const MoeModel m(16, 8, 12, 6, 3, 70);
  const int T = 7;
  const auto x = random_vec(static_cast<size_t>(T) * m.H, 71);
  std::vector<float> batch(T * m.H), single(m.H);
  ASSERT_TRUE(moe_forward(m.weights(), x.data(), T, batch.data()));
  for (int t = 0; t < T; ++t) {
    ASSERT_TRUE(moe_forward(m.weights(), x.data() + t * m.H, 1, single.data()));
    for (int o = 0; o < m.H; ++o) EXPECT_EQ(batch[t * m.H + o], single[o]);
  }
}

TEST(RefMoe, QuantizedExpertsMatchTheirDequantizedValues) {
  // Q8_0 expert stacks (H = I = 32) against F32 stacks holding exactly the dequantized values.
  MoeModel m(32, 32, 32, 4, 2, 80);
  auto requantize = [](F32Weights& w, std::vector<uint8_t>& bytes) {
    const size_t rows = static_cast<size_t>(w.n_out), row_bytes = (w.n_in / 32) * 34;
    bytes.resize(rows * row_bytes);
    for (size_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(quantize_row(GgmlType::kQ8_0, &w.w[r * w.n_in], &bytes[r * row_bytes], static_cast<int64_t>(w.n_in)));
      ASSERT_TRUE(
          dequantize_row(GgmlType::kQ8_0, &bytes[r * row_bytes], &w.w[r * w.n_in], static_cast<int64_t>(w.n_in)));
    }
  };
  std::vector<uint8_t> qg, qu, qd;
  requantize(m.gate_e, qg);
  requantize(m.up_e, qu);
  requantize(m.down_e, qd);
  MoeWeights wq = m.weights();
  wq.gate_exps = QuantExperts{GgmlType::kQ8_0, qg.data(), 32, 32, 4};
  wq.up_exps = QuantExperts{GgmlType::kQ8_0, qu.data(), 32, 32, 4};
  wq.down_exps = QuantExperts{GgmlType::kQ8_0, qd.data(), 32, 32, 4};
  const auto x = random_vec(static_cast<size_t>(3) * 32, 81);
  std::vector<float> a(3 * 32), b(3 * 32);
  ASSERT_TRUE(moe_forward(wq, x.data(), 3, a.data()));
  ASSERT_TRUE(moe_forward(m.weights(), x.data(), 3, b.data()));
  EXPECT_EQ(a, b);
}

TEST(RefMoe, ArgumentChecks) {
  const MoeModel m(16, 8, 12, 6, 2, 90);
  const auto x = random_vec(16, 91);
  std::vector<float> out(16);
  MoeWeights w = m.weights();
  w.n_expert_used = 7;
  Status s = moe_forward(w, x.data(), 1, out.data());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("expert_used_count"), std::string::npos);
  w = m.weights();
  w.down_exps.n_expert = 5;
  s = moe_forward(w, x.data(), 1, out.data());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("ffn_down_exps"), std::string::npos);
}

TEST(RefDenseFfn, MatchesNaiveSwiGlu) {
  const int H = 16, I = 24, T = 3;
  const F32Weights gate(H, I, 100, 0.4f), up(H, I, 101, 0.4f), down(I, H, 102, 0.4f);
  const auto x = random_vec(static_cast<size_t>(T) * H, 103);
  std::vector<float> out(T * H), want(T * H);
  ASSERT_TRUE(dense_ffn_forward(DenseFfnWeights{gate.view(), up.view(), down.view()}, x.data(), T, out.data()));
  for (int t = 0; t < T; ++t) {
    const auto y = naive_swiglu(gate, up, down, 0, 0, I, H, x.data() + t * H);
    for (int o = 0; o < H; ++o) want[t * H + o] = static_cast<float>(y[o]);
  }
  EXPECT_LT(max_rel_diff(out, want), 1e-5);
  // down must be {I, H}.
  const F32Weights bad_down(I + 1, H, 104);
  EXPECT_FALSE(dense_ffn_forward(DenseFfnWeights{gate.view(), up.view(), bad_down.view()}, x.data(), T, out.data()));
}

}  // namespace
}  // namespace kestrel::ref
