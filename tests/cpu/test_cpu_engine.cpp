// The CPU engine against the reference engine, on the golden fixtures and on every tiny preset of the three
// architectures (written by tests/core/engine/tiny_models.h with kestrel-mkmodel's library, including qwen3next's
// legacy ssm_in layout and a Q4_0 model):
//   - with f32 activations (CpuActivations::kF32), at every instruction-set level the CPU has, greedy tokens are
//     identical to the reference's for 40 steps after a prompt, logits within the tolerance below; at the scalar
//     level bit-identical;
//   - with the default activations (int8 where the level has int8 kernels), logits are bit-identical across runs
//     and at 1, 2 and hardware_concurrency threads;
//   - a session's logits are bit-identical alone or in a batch of 8 with others at other positions, and whether its
//     prompt comes in one item or in ticks cut at multiples of 64 positions, past one pass's token cut; other cuts
//     (which move the delta rule between its chunked and recurrent forms) agree within the tolerance;
//   - clone, snapshot and restore continue bit-identically (the snapshot is the reference engine's format); bad
//     input, a context overflow and a slot twice in one tick fail that item alone.
// The int8 checks run at the process's level (isa_selected): ctest runs this binary once more per lower level with
// KESTREL_CPU_ISA set (tests/cpu/CMakeLists.txt), a level the CPU lacks falling to the best below it.
//
// Tolerance: both engines compute in f32 from the same decoded weights; the CPU engine's GEMVs sum in another order
// (vector accumulators, FMA), ~1e-7 relative per product, growing through the layers to ~1e-5 at the logits (these
// random-weight models amplify a perturbation about 100× over their 8 layers). The check is
// max|Δ| ≤ 2e-3 · max(1, max|ref|) per row (the CUDA engine's bound): far above that, far below what a wrong head,
// gate, norm, routing or RoPE gives (O(1) of the row's scale).
// The int8 activations are not compared with the reference here: rounding them per 32-element block moves a GEMV by
// up to ~1% on these heavy-tailed activations, and the ~100× amplification (worse: the rounding is discontinuous, so
// two int8 engines summing in different orders drift apart the same way) turns that into 10–90% of the logits'
// scale — no tolerance tells that from a bug. They are checked layer by layer instead (test_cpu_blocks) and kernel
// by kernel (test_gemv).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/reference_engine.h"
#include "core/model/model.h"
#include "cpu/cpu_engine.h"
#include "cpu/isa.h"
#include "tests/core/engine/engine_test_util.h"
#include "tests/core/engine/tiny_models.h"

namespace kestrel::cpu {
namespace {

constexpr float kRelTol = 2e-3f;
constexpr int kCtx = 160;
constexpr int kGreedySteps = 40;

using test::rel_diff;

class CpuEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string path = test::model_path(GetParam());
    ASSERT_FALSE(path.empty());
    auto m = Model::open(path);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    model_ = std::move(*m);
    auto r = make_reference_engine(*model_, 4);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    ref_ = std::move(*r);
    cpu_ = make(0);
    ASSERT_TRUE(cpu_);
  }

  std::unique_ptr<CpuEngine> make(int threads, CpuActivations act = CpuActivations::kInt8,
                                  std::optional<Isa> isa = std::nullopt) {
    CpuEngineOptions o;
    o.max_slots = 10;
    o.threads = threads;
    o.max_ctx = kCtx;
    o.activations = act;
    o.isa = isa;
    auto e = make_cpu_engine(*model_, o);
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().to_string());
    return e ? std::move(*e) : nullptr;
  }

  // The logits after a 12-token prompt and after each of `steps` greedy tokens.
  static std::vector<std::vector<float>> greedy_run(Engine& e, int steps) {
    auto s = e.slot_alloc(kCtx);
    EXPECT_TRUE(s.has_value());
    std::vector<std::vector<float>> out;
    out.push_back(test::run_one(e, *s, test::iota_tokens(12)));
    for (int i = 0; i < steps; ++i) {
      const int32_t tok[1] = {test::argmax(out.back())};
      out.push_back(test::run_one(e, *s, tok));
    }
    e.slot_free(*s);
    return out;
  }

  // Replays the reference's greedy run `oracle` (greedy_run's logits) on `e`: at each step e's greedy token must
  // equal the reference's (so both engines see the same tokens throughout); returns the largest logits difference
  // seen (rel_diff).
  static float greedy_compare(const std::vector<std::vector<float>>& oracle, Engine& e) {
    auto s = e.slot_alloc(kCtx);
    EXPECT_TRUE(s.has_value());
    if (!s) return 1.0f;
    std::vector<float> l = test::run_one(e, *s, test::iota_tokens(12));
    float worst = rel_diff(l, oracle[0]);
    for (size_t step = 0; step + 1 < oracle.size(); ++step) {
      const int32_t rt = test::argmax(oracle[step]), ct = test::argmax(l);
      EXPECT_EQ(ct, rt) << "greedy token " << step << " differs";
      if (ct != rt) break;
      const int32_t tok[1] = {rt};
      l = test::run_one(e, *s, tok);
      worst = std::max(worst, rel_diff(l, oracle[step + 1]));
    }
    e.slot_free(*s);
    return worst;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> ref_;
  std::unique_ptr<CpuEngine> cpu_;
};

// At every instruction-set level this CPU has (CpuEngineOptions::isa), against one recorded reference run.
TEST_P(CpuEngineTest, GreedyTokensMatchTheReference) {
  const std::vector<std::vector<float>> oracle = greedy_run(*ref_, kGreedySteps);
  for (const Isa isa : kAllIsas) {
    if (!isa_supported(isa)) {
      std::printf("[ %s ] %s: this CPU lacks it; tested on a machine that has it\n", GetParam().c_str(),
                  std::string(isa_name(isa)).c_str());
      continue;
    }
    std::unique_ptr<CpuEngine> f32 = make(0, CpuActivations::kF32, isa);
    ASSERT_TRUE(f32);
    const float worst = greedy_compare(oracle, *f32);
    EXPECT_LE(worst, kRelTol) << f32->summary();
    if (isa == Isa::kScalar) {
      EXPECT_EQ(worst, 0.0f) << "the scalar level is the reference's arithmetic";
    }
    std::printf("[ %s ] %s: %d greedy tokens equal to the reference's; logits max rel diff %.3g (tolerance %.1g)\n",
                GetParam().c_str(), f32->summary().c_str(), kGreedySteps, worst, kRelTol);
  }
}

TEST_P(CpuEngineTest, BitIdenticalAcrossRunsAndThreadCounts) {
  const std::vector<std::vector<float>> first = greedy_run(*cpu_, 6);
  EXPECT_EQ(greedy_run(*cpu_, 6), first) << "a second run on the same engine";
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {1, 2, hw}) {
    std::unique_ptr<CpuEngine> e = make(threads);
    ASSERT_TRUE(e);
    EXPECT_EQ(greedy_run(*e, 6), first) << threads << " threads (" << e->summary() << ")";
  }
}

TEST_P(CpuEngineTest, BatchAndChunkingInvariant) {
  Engine& e = *cpu_;
  // 150 tokens: more than one pass's cut of 128, two whole 64-position chunks for the chunked delta rule.
  const std::vector<int32_t> prompt = test::iota_tokens(150, 5, 13);
  const int32_t next[1] = {42};
  auto a = e.slot_alloc(kCtx);
  ASSERT_TRUE(a);
  const std::vector<float> after_prompt = test::run_one(e, *a, prompt);
  const std::vector<float> alone = test::run_one(e, *a, next);

  // The same prompt in chunks of 64, 64 and 22 over three ticks (cuts on the delta rule's chunks): the same bits.
  e.slot_reset(*a);
  test::run_one(e, *a, std::span<const int32_t>(prompt).first(64));
  test::run_one(e, *a, std::span<const int32_t>(prompt).subspan(64, 64));
  EXPECT_EQ(test::run_one(e, *a, std::span<const int32_t>(prompt).subspan(128)), after_prompt);

  // Cuts off the chunks (5, 70, 75) move whole chunks to the recurrent form: the reference's two forms' agreement,
  // checked with f32 activations (int8 rounding turns any f32 difference into a step, see the file head).
  {
    std::unique_ptr<CpuEngine> f32 = make(0, CpuActivations::kF32);
    ASSERT_TRUE(f32);
    auto b = f32->slot_alloc(kCtx);
    ASSERT_TRUE(b);
    const std::vector<float> whole = test::run_one(*f32, *b, prompt);
    f32->slot_reset(*b);
    test::run_one(*f32, *b, std::span<const int32_t>(prompt).first(5));
    test::run_one(*f32, *b, std::span<const int32_t>(prompt).subspan(5, 70));
    const std::vector<float> cut = test::run_one(*f32, *b, std::span<const int32_t>(prompt).subspan(75));
    EXPECT_LE(rel_diff(cut, whole), kRelTol);
    EXPECT_EQ(test::argmax(cut), test::argmax(whole));
  }

  // In a batch of 8: seven other sessions at other positions, session a's prompt in a mixed tick.
  e.slot_reset(*a);
  std::vector<SlotId> others;
  for (int i = 0; i < 7; ++i) {
    auto s = e.slot_alloc(kCtx);
    ASSERT_TRUE(s);
    others.push_back(*s);
    test::run_one(e, *s, test::iota_tokens(1 + 3 * i, 100 + i, 3));
  }
  std::vector<EngineStepItem> items = {{*a, prompt}};
  const int32_t other_tok[1] = {77};
  for (SlotId s : others) items.push_back({s, other_tok});
  test::TickResult mixed = test::run_tick(e, items);
  ASSERT_TRUE(mixed.status[0]);
  EXPECT_EQ(mixed.logits[0], after_prompt) << "the prompt's logits depend on the batch";
  items[0].tokens = next;
  test::TickResult batch = test::run_tick(e, items);
  ASSERT_TRUE(batch.status[0]);
  EXPECT_EQ(batch.logits[0], alone) << "a session's logits depend on the batch";
}

TEST_P(CpuEngineTest, CloneSnapshotRestoreAndErrors) {
  Engine& e = *cpu_;
  auto a = e.slot_alloc(kCtx);
  ASSERT_TRUE(a);
  test::run_one(e, *a, test::iota_tokens(7));
  auto c = e.slot_alloc(kCtx + 0);
  auto big = e.slot_alloc(kCtx);
  ASSERT_TRUE(c && big);
  ASSERT_TRUE(e.slot_clone(*a, *c));
  const int32_t third[1] = {9};
  auto snap = e.slot_snapshot(*a);
  ASSERT_TRUE(snap.has_value());
  test::TickResult fork = test::run_tick(e, {{*a, third}, {*c, third}});
  ASSERT_TRUE(fork.status[0] && fork.status[1]);
  EXPECT_EQ(fork.logits[0], fork.logits[1]);

  // Clone into a slot of another capacity.
  e.slot_free(*big);
  auto small = e.slot_alloc(20);
  ASSERT_TRUE(small);
  ASSERT_TRUE(e.slot_restore(*c, *snap));
  ASSERT_TRUE(e.slot_clone(*c, *small));
  EXPECT_EQ(test::run_one(e, *small, third), fork.logits[0]);

  // argmax_only gives the greedy token of the same logits.
  ASSERT_TRUE(e.slot_restore(*a, *snap));
  {
    std::vector<EngineStepItem> greedy = {{*a, third, /*argmax_only=*/true}};
    std::vector<EngineStepOutput> gout(1);
    e.step(greedy, gout);
    ASSERT_TRUE(gout[0].status);
    EXPECT_EQ(gout[0].argmax, test::argmax(fork.logits[0]));
  }

  // The reference engine restores a CPU engine's snapshot and continues within tolerance (an f32-activation engine:
  // the int8 one's state is another computation's, see the file head).
  {
    std::unique_ptr<CpuEngine> f32 = make(0, CpuActivations::kF32);
    ASSERT_TRUE(f32);
    auto fs = f32->slot_alloc(kCtx);
    ASSERT_TRUE(fs);
    test::run_one(*f32, *fs, test::iota_tokens(7));
    auto fsnap = f32->slot_snapshot(*fs);
    ASSERT_TRUE(fsnap.has_value());
    auto r = ref_->slot_alloc(kCtx);
    ASSERT_TRUE(r);
    ASSERT_TRUE(ref_->slot_restore(*r, *fsnap)) << "snapshot formats differ";
    EXPECT_LE(rel_diff(test::run_one(*f32, *fs, third), test::run_one(*ref_, *r, third)), kRelTol);
  }

  // Bad input fails its item alone and leaves the slot unchanged.
  const int64_t before = e.slot_n_past(*a);
  const int32_t bad[2] = {1, static_cast<int32_t>(model_->hparams().n_vocab)};
  test::TickResult refused = test::run_tick(e, {{*a, bad}, {*c, third}});
  ASSERT_FALSE(refused.status[0]);
  EXPECT_EQ(refused.status[0].error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(refused.status[1]);
  EXPECT_EQ(e.slot_n_past(*a), before);
  test::TickResult twice = test::run_tick(e, {{*c, third}, {*c, third}});
  EXPECT_TRUE(twice.status[0]);
  ASSERT_FALSE(twice.status[1]) << "a slot twice in one tick is refused";
  const std::vector<int32_t> too_long = test::iota_tokens(kCtx, 1, 1);
  EXPECT_EQ(e.check({*a, too_long}).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(e.slot_alloc(kCtx + 1).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(e.name(), "cpu");
  EXPECT_EQ(e.placement().device, "cpu");
}

INSTANTIATE_TEST_SUITE_P(Models, CpuEngineTest,
                         ::testing::Values("golden-qwen35moe", "golden-qwen35", "golden-qwen3next", "tiny",
                                           "tiny-qwen3next", "tiny-qwen35", "tiny-qwen3next-legacy", "tiny-q4_0"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(CpuEngine, RefusesBadOptions) {
  auto m = Model::open(test::fixture_model_path("golden-qwen35moe"));
  ASSERT_TRUE(m.has_value());
  CpuEngineOptions o;
  o.max_slots = 0;
  EXPECT_EQ(make_cpu_engine(**m, o).error().code, ErrorCode::kInvalidArgument);
  o.max_slots = 1;
  o.threads = -1;
  EXPECT_EQ(make_cpu_engine(**m, o).error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel::cpu
