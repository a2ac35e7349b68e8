// Per-layer agreement of the CPU engine's blocks (GdnBlock, AttentionBlock, FfnBlock) with the reference's layer
// functions (ref::gdn_forward, ref::attn_forward, ref::moe_forward / ref::dense_ffn_forward) on the golden fixture
// models: every layer of each model is fed the same input rows, from the same state (5 tokens already through both),
// and its output compared row by row, at every instruction-set level this CPU has (isa.h), with f32 and with int8
// activations (the scalar level, which has no int8 kernels, equal to the reference bit for bit).
//
// Tolerance, max|Δ| ≤ tol · max(1, max|ref|) per row (the engine tests' measure):
// - f32 activations: 1e-4. The block differs from the reference by the GEMVs' summation order (~1e-7 relative per
//   product) through at most three GEMVs in sequence; measured ≤ 3e-6.
// - int8 activations: 4e-2 for the FFN, 8e-2 for GDN / attention. Each GEMV's input is rounded per 32-element
//   block (per 256 for the K-quants at avx2 / avxvnni) to 1/254 of the block's largest value (act_q8.h), a relative
//   error of up to ~0.4% per element that sums to ~0.5–1% of a GEMV's output on these heavy-tailed activations. The FFN
//   chains two (gate/up → SwiGLU → down): measured ≤ 1.7e-2. GDN chains the projections, the gates' exp/softplus, the
//   q/k L2 norms and the gated RMSNorm (which rescales each head's output to unit RMS, so a small head's relative error
//   is passed on whole) into ssm_out, rounded again: measured ≤ 4.2e-2. A wrong head, gate, routing or norm is O(1) of
//   the row's scale.
// These are single-layer figures: over the 8 layers of a whole random-weight model the differences grow ~100×,
// which is why the engine tests compare int8 against nothing but itself (bits across threads and batches).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/reference/ffn.h"
#include "core/reference/model_weights.h"
#include "core/reference/moe.h"
#include "core/reference/session_state.h"
#include "cpu/attention_block.h"
#include "cpu/ffn_block.h"
#include "cpu/gdn_block.h"
#include "cpu/isa.h"
#include "cpu/matmul.h"
#include "cpu/worker_pool.h"
#include "tests/core/engine/engine_test_util.h"

namespace kestrel::cpu {
namespace {

constexpr int kCtx = 320;
constexpr int kPrefix = 5;  // tokens through both before the compared ones
constexpr int kTokens = 7;

// max over rows of max|a − b| / max(1, max|b|), rows of width w.
float row_rel_diff(const std::vector<float>& a, const std::vector<float>& b, size_t w) {
  float worst = 0.0f;
  for (size_t r = 0; r * w < b.size(); ++r) {
    float d = 0.0f, m = 1.0f;
    for (size_t i = r * w; i < (r + 1) * w; ++i) {
      d = std::max(d, std::fabs(a[i] - b[i]));
      m = std::max(m, std::fabs(b[i]));
    }
    worst = std::max(worst, d / m);
  }
  return worst;
}

struct Mode {
  GemvInput act;
  float tol_mix;  // GDN / attention
  float tol_ffn;
  const char* name;
};

class CpuBlocksTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = test::open_fixture(GetParam());
    ASSERT_TRUE(model_);
    auto w = ref::RefModelWeights::from_catalog(model_->catalog());
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    weights_ = std::move(*w);
    auto pool = WorkerPool::create(1, /*pin=*/false);
    ASSERT_TRUE(pool.has_value());
    pool_ = std::move(*pool);
  }

  // Runs `n` rows of x through layer l's two blocks on both sides (attention/GDN into out_a, FFN into out_f), the
  // CPU side on `cpu_state`, the reference on `ref_state`; n_past tokens are already in both.
  void run_layer(MatmulRunner& mm, uint32_t l, const float* x, int n, int64_t n_past, ref::SessionState& ref_state,
                 ref::SessionState& cpu_state, std::vector<float>* ref_a, std::vector<float>* cpu_a,
                 std::vector<float>* ref_f, std::vector<float>* cpu_f) {
    const ref::RefLayerWeights& lw = weights_.layers[l];
    const size_t H = model_->hparams().n_embd;
    const Segment seg{&cpu_state, 0, n, n_past};
    Pass pass;
    pass.mm = &mm;
    pass.segments = std::span<const Segment>(&seg, 1);
    pass.n_rows = n;
    ref_a->assign(static_cast<size_t>(n) * H, 0.0f);
    cpu_a->assign(static_cast<size_t>(n) * H, 0.0f);
    ref_f->assign(static_cast<size_t>(n) * H, 0.0f);
    cpu_f->assign(static_cast<size_t>(n) * H, 0.0f);
    if (lw.kind == LayerKind::kGatedDeltaNet) {
      ASSERT_TRUE(ref::gdn_forward(lw.gdn, ref_state.gdn(l), x, n, ref_a->data(), ref::GdnMode::kRecurrent));
      gdn_.run(pass, lw.gdn, l, x, cpu_a->data());
    } else {
      ASSERT_TRUE(ref::attn_forward(lw.attn, ref_state.kv(l), x, n, n_past, ref_a->data()));
      attn_.run(pass, lw.attn, l, x, cpu_a->data());
    }
    if (lw.is_moe) {
      ASSERT_TRUE(ref::moe_forward(lw.moe, x, n, ref_f->data()));
      ffn_.run_moe(pass, lw.moe, x, cpu_f->data());
    } else {
      ASSERT_TRUE(ref::dense_ffn_forward(lw.dense, x, n, ref_f->data()));
      ffn_.run_dense(pass, lw.dense, x, cpu_f->data());
    }
  }

  std::unique_ptr<Model> model_;
  ref::RefModelWeights weights_;
  std::unique_ptr<WorkerPool> pool_;
  GdnBlock gdn_;
  AttentionBlock attn_;
  FfnBlock ffn_;
};

TEST_P(CpuBlocksTest, EveryLayerAgreesWithTheReference) {
  const ModelHparams& hp = model_->hparams();
  const size_t H = hp.n_embd;
  for (const Isa isa : kAllIsas) {
    if (!isa_supported(isa)) {
      std::printf("[ %s ] %s: this CPU lacks it; tested on a machine that has it\n", GetParam().c_str(),
                  std::string(isa_name(isa)).c_str());
      continue;
    }
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> prefix(kPrefix * H), x(kTokens * H);
    for (float& v : prefix) v = dist(rng);
    for (float& v : x) v = dist(rng);
    for (const Mode mode : {Mode{GemvInput::kF32, 1e-4f, 1e-4f, "f32"}, Mode{GemvInput::kQ8, 8e-2f, 4e-2f, "int8"}}) {
      MatmulRunner mm(*pool_, isa, mode.act);
      // A level without int8 kernels runs the int8 mode on f32 (gemv_kernel's fallback).
      const bool int8 = gemv_kernel(isa, GgmlType::kQ4_0, mode.act).input != GemvInput::kF32;
      float worst_mix = 0.0f, worst_ffn = 0.0f;
      for (uint32_t l = 0; l < weights_.layers.size(); ++l) {
        auto rs = ref::SessionState::create(hp, kCtx);
        ASSERT_TRUE(rs.has_value());
        ref::SessionState cs = *rs;
        std::vector<float> ra, ca, rf, cf;
        run_layer(mm, l, prefix.data(), kPrefix, 0, *rs, cs, &ra, &ca, &rf, &cf);
        run_layer(mm, l, x.data(), kTokens, kPrefix, *rs, cs, &ra, &ca, &rf, &cf);
        const float dm = row_rel_diff(ca, ra, H), df = row_rel_diff(cf, rf, H);
        EXPECT_LE(dm, mode.tol_mix) << isa_name(isa) << " " << mode.name << " layer " << l << " (GDN or attention)";
        EXPECT_LE(df, mode.tol_ffn) << isa_name(isa) << " " << mode.name << " layer " << l << " (FFN)";
        worst_mix = std::max(worst_mix, dm);
        worst_ffn = std::max(worst_ffn, df);
      }
      if (isa == Isa::kScalar) {
        // The scalar level is the reference's arithmetic (int8 mode falls back to f32 there).
        EXPECT_EQ(worst_mix, 0.0f) << mode.name;
        EXPECT_EQ(worst_ffn, 0.0f) << mode.name;
      }
      std::printf(
          "[ %s ] %s (%s mode), %s activations: worst layer rel diff %.3g (GDN/attention, tolerance %.1g), %.3g "
          "(FFN, %.1g)\n",
          GetParam().c_str(), std::string(isa_name(isa)).c_str(), mode.name, int8 ? "int8" : "f32", worst_mix,
          mode.tol_mix, worst_ffn, mode.tol_ffn);
    }
  }
}

// The GDN layers on prompts of T = 1, 63, 64, 65 and 300 tokens in one pass (whole aligned 64-token chunks through
// the chunked delta rule, the rest recurrent), from position 0 and from position 10 (so no chunk starts the pass),
// against the reference's recurrent and chunked forms; f32 activations, the same 1e-4 bound.
TEST_P(CpuBlocksTest, GdnPromptsAgreeWithBothReferenceForms) {
  const ModelHparams& hp = model_->hparams();
  const size_t H = hp.n_embd;
  MatmulRunner mm(*pool_, isa_selected(), GemvInput::kF32);
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const uint32_t l = 0;  // the first layer is a GDN layer in every preset
  ASSERT_EQ(weights_.layers[l].kind, LayerKind::kGatedDeltaNet);
  const ref::GdnWeights& w = weights_.layers[l].gdn;
  for (int64_t n_past : {0, 10}) {
    for (int T : {1, 63, 64, 65, 300}) {
      std::vector<float> prefix(static_cast<size_t>(n_past) * H), x(static_cast<size_t>(T) * H);
      for (float& v : prefix) v = dist(rng);
      for (float& v : x) v = dist(rng);
      auto base = ref::SessionState::create(hp, kCtx);
      ASSERT_TRUE(base.has_value());
      std::vector<float> scratch(prefix.size());
      if (n_past > 0) {
        ASSERT_TRUE(ref::gdn_forward(w, base->gdn(l), prefix.data(), static_cast<int>(n_past), scratch.data(),
                                     ref::GdnMode::kRecurrent));
      }
      ref::SessionState rec = *base, chk = *base, cs = *base;
      std::vector<float> out_rec(x.size()), out_chk(x.size()), out_cpu(x.size());
      ASSERT_TRUE(ref::gdn_forward(w, rec.gdn(l), x.data(), T, out_rec.data(), ref::GdnMode::kRecurrent));
      ASSERT_TRUE(ref::gdn_forward(w, chk.gdn(l), x.data(), T, out_chk.data(), ref::GdnMode::kChunked));
      const Segment seg{&cs, 0, T, n_past};
      Pass pass;
      pass.mm = &mm;
      pass.segments = std::span<const Segment>(&seg, 1);
      pass.n_rows = T;
      gdn_.run(pass, w, l, x.data(), out_cpu.data());
      const std::string what = "T " + std::to_string(T) + " from position " + std::to_string(n_past);
      EXPECT_LE(row_rel_diff(out_cpu, out_rec, H), 1e-4f) << what << " vs recurrent";
      EXPECT_LE(row_rel_diff(out_cpu, out_chk, H), 1e-4f) << what << " vs chunked";
      EXPECT_LE(row_rel_diff(cs.gdn(l).s, rec.gdn(l).s, cs.gdn(l).s.size()), 1e-4f) << what << " state";
      EXPECT_LE(row_rel_diff(cs.gdn(l).conv, rec.gdn(l).conv, cs.gdn(l).conv.size()), 1e-4f) << what << " conv";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CpuBlocksTest,
                         ::testing::Values("golden-qwen35moe", "golden-qwen35", "golden-qwen3next"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace kestrel::cpu
