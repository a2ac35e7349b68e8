// The CUDA engine against the reference engine, on the golden fixtures and on every tiny preset (written here with
// kestrel-mkmodel's library), plus a Q4_0 tiny model whose projections and MoE layers all take the tiled GEMV v4 /
// moe_imma path:
//   - logits after a prompt and per-layer residual streams agree within the tolerance below;
//   - greedy tokens are identical for 64 steps;
//   - a session's logits are bit-identical alone or in a batch of 8 with others at other positions;
//   - clone, snapshot and restore continue bit-identically; a bad token or a context overflow leaves the slot alone;
//   - a prompt run as runs of tokens per pass gives the bits of the same prompt a token per pass.
//
// Tolerance: both engines compute in f32 from the same quantized weights and differ only in summation order (GEMV
// partial sums, block reductions in the norms, attention's online softmax, GEMV v4's exact 7-bit-digit activations
// ≤ 2^-22 relative per element) and in device expf/cosf. Those differences are ~1e-6 relative per op; through 8
// layers of residual adds they grow to ~1e-5. The check is max|Δ| ≤ 2e-3 · max(1, max|ref|) per row — two orders of
// magnitude above what is measured (printed by the test), and far below what a wrong head mapping, gate, norm or RoPE
// gives (O(1) of the row's scale).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/engine/reference_engine.h"
#include "core/model/model.h"
#include "core/reference/forward.h"
#include "core/reference/model_weights.h"
#include "gpu/engine/cuda_engine.h"
#include "tests/core/engine/engine_test_util.h"
#include "tools/mkmodel/model_plan.h"
#include "tools/mkmodel/model_writer.h"
#include "tools/mkmodel/presets.h"
#include "tools/mkmodel/vocab_source.h"

namespace kestrel {
namespace {

constexpr float kRelTol = 2e-3f;
constexpr int kCtx = 160;

bool have_device() { return gpu::cuda_unavailable_reason().empty(); }

// Writes a tiny preset (with the Qwen3 vocabulary, so Model::open accepts it) once per process.
std::string write_tiny(const std::string& preset_name, const std::string& file, bool legacy, bool imma) {
  const std::string path = ::testing::TempDir() + "/" + file;
  auto preset = mkmodel::find_preset(preset_name);
  EXPECT_TRUE(preset.has_value());
  if (!preset) return "";
  mkmodel::PlanOptions po;
  if (legacy) po.gdn_input = GdnInputLayout::kLegacySsmIn;
  if (imma) {
    // The moe_imma path needs the shared expert's ff equal to the experts' and tileable types.
    preset->hparams.n_ff_shared = preset->hparams.n_ff_expert;
    po.uniform_type = GgmlType::kQ4_0;
  }
  auto plan = mkmodel::make_model_plan(*preset, po);
  EXPECT_TRUE(plan.has_value()) << (plan ? "" : plan.error().to_string());
  if (!plan) return "";
  auto vocab_file = mkmodel::find_vocab_file("");
  EXPECT_TRUE(vocab_file.has_value());
  if (!vocab_file) return "";
  auto vocab = mkmodel::load_vocab(*vocab_file, preset->hparams.n_vocab);
  EXPECT_TRUE(vocab.has_value());
  if (!vocab) return "";
  auto stats = mkmodel::write_model(
      *plan, path, [&](GgufWriter& w) { return mkmodel::add_vocab_metadata(w, *vocab); }, mkmodel::WriteOptions{});
  EXPECT_TRUE(stats.has_value()) << (stats ? "" : stats.error().to_string());
  return stats ? path : "";
}

class CudaEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
    const std::string& name = GetParam();
    std::string path;
    if (name.starts_with("golden")) {
      path = test::fixture_model_path(name);
    } else if (name == "tiny-imma") {
      path = write_tiny("tiny", "cuda_tiny_imma.gguf", false, true);
    } else if (name == "tiny-qwen3next-legacy") {
      path = write_tiny("tiny-qwen3next", "cuda_tiny_legacy.gguf", true, false);
    } else {
      path = write_tiny(name, "cuda_" + name + ".gguf", false, false);
    }
    ASSERT_FALSE(path.empty());
    auto m = Model::open(path);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    model_ = std::move(*m);
    auto r = make_reference_engine(*model_, 4);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    ref_ = std::move(*r);
    gpu::CudaEngineOptions o;
    o.max_slots = 10;
    o.n_ctx = kCtx;
    auto c = gpu::make_cuda_engine(*model_, o);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    cuda_ = std::move(*c);
    std::printf("[ %s ] %s\n", name.c_str(), cuda_->layout_summary().c_str());
  }

  // max|a − b| / max(1, max|b|).
  static float rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0.0f, m = 1.0f;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      d = std::max(d, std::fabs(a[i] - b[i]));
      m = std::max(m, std::fabs(b[i]));
    }
    return d / m;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> ref_;
  std::unique_ptr<gpu::CudaEngine> cuda_;
};

TEST_P(CudaEngineTest, LogitsAndGreedyTokensMatchTheReference) {
  const std::vector<int32_t> prompt = test::iota_tokens(12);
  auto rs = ref_->slot_alloc(kCtx);
  auto cs = cuda_->slot_alloc(kCtx);
  ASSERT_TRUE(rs && cs);
  std::vector<float> rl = test::run_one(*ref_, *rs, prompt);
  std::vector<float> cl = test::run_one(*cuda_, *cs, prompt);
  const float d0 = rel_diff(cl, rl);
  EXPECT_LE(d0, kRelTol) << "logits after the prompt";
  float worst = d0;
  int n_same = 0;
  for (int step = 0; step < 64; ++step) {
    const int32_t rt = test::argmax(rl), ct = test::argmax(cl);
    ASSERT_EQ(ct, rt) << "greedy token " << step << " differs (after " << n_same << " equal)";
    ++n_same;
    const int32_t tok[1] = {rt};
    rl = test::run_one(*ref_, *rs, tok);
    cl = test::run_one(*cuda_, *cs, tok);
    worst = std::max(worst, rel_diff(cl, rl));
  }
  EXPECT_LE(worst, kRelTol);
  std::printf("[ %s ] 64 greedy tokens equal; logits max rel diff %.3g (tolerance %.1g)\n", GetParam().c_str(), worst,
              kRelTol);
}

TEST_P(CudaEngineTest, PerLayerHiddenStatesMatchTheReference) {
  const std::vector<int32_t> prompt = test::iota_tokens(9, 3, 11);
  auto weights = ref::RefModelWeights::from_catalog(model_->catalog());
  ASSERT_TRUE(weights.has_value());
  auto state = ref::SessionState::create(model_->hparams(), kCtx);
  ASSERT_TRUE(state.has_value());
  ref::ForwardOptions fo;
  fo.gdn_mode = ref::GdnMode::kRecurrent;
  ref::ForwardOutput prefill;
  ASSERT_TRUE(ref::forward(*weights, *state, std::span<const int32_t>(prompt).first(8), fo, &prefill));
  fo.capture_hidden = true;
  ref::ForwardOutput last;
  ASSERT_TRUE(ref::forward(*weights, *state, std::span<const int32_t>(prompt).subspan(8), fo, &last));

  auto cs = cuda_->slot_alloc(kCtx);
  ASSERT_TRUE(cs);
  test::run_one(*cuda_, *cs, std::span<const int32_t>(prompt).first(8));
  std::vector<float> logits(model_->hparams().n_vocab);
  EngineStepItem item{*cs, std::span<const int32_t>(prompt).subspan(8)};
  EngineStepOutput out;
  out.logits = logits;
  std::vector<float> hidden;
  cuda_->step_with_hidden(std::span<const EngineStepItem>(&item, 1), std::span<EngineStepOutput>(&out, 1), &hidden);
  ASSERT_TRUE(out.status) << out.status.error().to_string();
  const size_t H = model_->hparams().n_embd;
  ASSERT_EQ(hidden.size(), last.hidden.size());
  float worst = 0.0f;
  for (uint32_t l = 0; l < model_->hparams().n_layer; ++l) {
    std::vector<float> a(hidden.begin() + l * H, hidden.begin() + (l + 1) * H);
    std::vector<float> b(last.hidden.begin() + l * H, last.hidden.begin() + (l + 1) * H);
    const float d = rel_diff(a, b);
    EXPECT_LE(d, kRelTol) << "layer " << l;
    worst = std::max(worst, d);
  }
  EXPECT_LE(rel_diff(logits, last.logits), kRelTol);
  std::printf("[ %s ] per-layer hidden max rel diff %.3g\n", GetParam().c_str(), worst);
}

TEST_P(CudaEngineTest, BatchInvariantCloneSnapshotRestore) {
  Engine& e = *cuda_;
  // Session a alone: prompt, then one decode token.
  const std::vector<int32_t> prompt = test::iota_tokens(7, 5, 13);
  const int32_t next[1] = {42};
  auto a = e.slot_alloc(kCtx);
  ASSERT_TRUE(a);
  test::run_one(e, *a, prompt);
  const std::vector<float> alone = test::run_one(e, *a, next);

  // The same in a batch of 8: seven other sessions at other positions (prompts of 1..7 tokens fed before), and
  // session a's prompt fed as part of a mixed tick.
  e.slot_reset(*a);
  std::vector<SlotId> others;
  std::vector<std::vector<int32_t>> other_prompts;
  for (int i = 0; i < 7; ++i) {
    auto s = e.slot_alloc(kCtx);
    ASSERT_TRUE(s);
    others.push_back(*s);
    other_prompts.push_back(test::iota_tokens(1 + i, 100 + i, 3));
    test::run_one(e, *s, other_prompts.back());
  }
  std::vector<EngineStepItem> items = {{*a, prompt}};
  const int32_t other_tok[1] = {77};
  for (SlotId s : others) items.push_back({s, other_tok});
  ASSERT_TRUE(test::run_tick(e, items).status[0]);
  items[0].tokens = next;
  test::TickResult batch = test::run_tick(e, items);
  ASSERT_TRUE(batch.status[0]);
  EXPECT_EQ(batch.logits[0], alone) << "a session's logits depend on the batch";

  // Clone forks exactly; snapshot + restore replays exactly.
  auto c = e.slot_alloc(kCtx);
  ASSERT_TRUE(c);
  ASSERT_TRUE(e.slot_clone(*a, *c));
  EXPECT_EQ(e.slot_n_past(*c), e.slot_n_past(*a));
  const int32_t third[1] = {9};
  auto snap = e.slot_snapshot(*a);
  ASSERT_TRUE(snap.has_value()) << snap.error().to_string();
  test::TickResult fork = test::run_tick(e, {{*a, third}, {*c, third}});
  ASSERT_TRUE(fork.status[0] && fork.status[1]);
  EXPECT_EQ(fork.logits[0], fork.logits[1]);
  // argmax_only gives the greedy token of the same logits (session a replays `third` from the snapshot).
  ASSERT_TRUE(e.slot_restore(*a, *snap));
  {
    std::vector<EngineStepItem> greedy = {{*a, third, /*argmax_only=*/true}};
    std::vector<EngineStepOutput> gout(1);
    e.step(greedy, gout);
    ASSERT_TRUE(gout[0].status);
    EXPECT_EQ(gout[0].argmax, test::argmax(fork.logits[0]));
  }
  ASSERT_TRUE(e.slot_restore(*c, *snap));
  EXPECT_EQ(e.slot_n_past(*c), e.slot_n_past(*a) - 1);
  EXPECT_EQ(test::run_one(e, *c, third), fork.logits[0]);

  // The reference engine restores the CUDA engine's snapshot (one format) and continues within tolerance.
  auto r = ref_->slot_alloc(kCtx);
  ASSERT_TRUE(r);
  ASSERT_TRUE(ref_->slot_restore(*r, *snap)) << "snapshot formats differ";
  EXPECT_LE(rel_diff(fork.logits[0], test::run_one(*ref_, *r, third)), kRelTol);

  // Bad input is refused and leaves the slot alone.
  const int64_t before = e.slot_n_past(*a);
  const int32_t bad[2] = {1, static_cast<int32_t>(model_->hparams().n_vocab)};
  test::TickResult refused = test::run_tick(e, {{*a, bad}, {*c, third}});
  ASSERT_FALSE(refused.status[0]);
  EXPECT_EQ(refused.status[0].error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(refused.status[1]) << "the other item of the tick proceeds";
  EXPECT_EQ(e.slot_n_past(*a), before);
  test::TickResult twice = test::run_tick(e, {{*c, third}, {*c, third}});
  EXPECT_TRUE(twice.status[0]);
  ASSERT_FALSE(twice.status[1]) << "a slot twice in one tick is refused";
  EXPECT_EQ(twice.status[1].error().code, ErrorCode::kInvalidArgument);
  const std::vector<int32_t> too_long = test::iota_tokens(kCtx, 1, 1);
  EXPECT_EQ(e.check({*a, too_long}).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(e.slot_n_past(*a), before);
  EXPECT_EQ(e.slot_alloc(kCtx + 1).error().code, ErrorCode::kOutOfRange);
}

// A prompt fed as one item runs as runs of up to 32 of its tokens per pass (gdn_runs, attention over rows of one
// slot); token by token it runs a pass per token on the decode kernels. Both must give the same bits: the logits
// after the prompt and the whole state (snapshot bytes). A prompt sharing its passes with decode tokens of other
// sessions leaves theirs as they are alone. And the reference agrees within the tolerance after 75 tokens.
TEST_P(CudaEngineTest, PromptRunsGiveTheBitsOfTokenByToken) {
  Engine& e = *cuda_;
  const std::vector<int32_t> prompt = test::iota_tokens(75, 17, 29);
  auto a = e.slot_alloc(kCtx);
  auto b = e.slot_alloc(kCtx);
  ASSERT_TRUE(a && b);
  const std::vector<float> whole = test::run_one(e, *a, prompt);
  std::vector<float> single;
  for (const int32_t t : prompt) single = test::run_one(e, *b, std::span<const int32_t>(&t, 1));
  EXPECT_EQ(whole, single) << "a prompt's logits depend on how it was cut into passes";
  auto sa = e.slot_snapshot(*a);
  auto sb = e.slot_snapshot(*b);
  ASSERT_TRUE(sa && sb);
  EXPECT_TRUE(*sa == *sb) << "a prompt's state depends on how it was cut into passes";

  auto r = ref_->slot_alloc(kCtx);
  ASSERT_TRUE(r);
  EXPECT_LE(rel_diff(whole, test::run_one(*ref_, *r, prompt)), kRelTol);

  // Decode tokens of three sessions alone, then the same beside a 40-token prompt of a fourth.
  std::vector<SlotId> dec;
  for (int i = 0; i < 3; ++i) {
    auto s = e.slot_alloc(kCtx);
    ASSERT_TRUE(s);
    dec.push_back(*s);
    test::run_one(e, *s, test::iota_tokens(3 + 5 * i, 50 + i, 7));
  }
  auto snap0 = e.slot_snapshot(dec[0]);
  ASSERT_TRUE(snap0);
  const int32_t tok[1] = {123};
  const std::vector<float> alone = test::run_one(e, dec[0], tok);
  ASSERT_TRUE(e.slot_restore(dec[0], *snap0));
  auto p = e.slot_alloc(kCtx);
  ASSERT_TRUE(p);
  const std::vector<int32_t> long_prompt = test::iota_tokens(40, 3, 11);
  test::TickResult mixed = test::run_tick(e, {{dec[0], tok}, {*p, long_prompt}, {dec[1], tok}, {dec[2], tok}});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(mixed.status[static_cast<size_t>(i)]);
  EXPECT_EQ(mixed.logits[0], alone) << "a decode token's logits depend on a prompt in its passes";
  auto q = e.slot_alloc(kCtx);
  ASSERT_TRUE(q);
  EXPECT_EQ(mixed.logits[1], test::run_one(e, *q, long_prompt)) << "a prompt's logits depend on its tick";
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineTest,
                         ::testing::Values("golden-qwen35moe", "golden-qwen35", "golden-qwen3next", "tiny",
                                           "tiny-qwen3next", "tiny-qwen35", "tiny-qwen3next-legacy", "tiny-imma"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(CudaEngine, RefusesWhatDoesNotFit) {
  if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
  auto m = Model::open(test::fixture_model_path("golden-qwen35moe"));
  ASSERT_TRUE(m.has_value());
  gpu::CudaEngineOptions o;
  o.max_slots = 1 << 20;
  o.n_ctx = static_cast<int32_t>((*m)->hparams().n_ctx_train);
  auto e = gpu::make_cuda_engine(**m, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(e.error().message.find("free"), std::string::npos) << "names what is free: " << e.error().message;
  o.max_slots = 0;
  EXPECT_EQ(gpu::make_cuda_engine(**m, o).error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel
