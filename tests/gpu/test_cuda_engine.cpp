// The CUDA engine against the reference engine, on the golden fixtures and on every tiny preset (written here with
// kestrel-mkmodel's library), plus a Q4_0 tiny model whose projections and MoE layers all take the tiled GEMV v4 /
// moe_imma path, and its H-256 form whose prompt passes run every projection and expert on gemm_imma:
//   - logits after a prompt and per-layer residual streams agree within the tolerance below;
//   - greedy tokens are identical for 64 steps;
//   - a session's logits are bit-identical alone or in a batch of 8 with others at other positions;
//   - clone, snapshot and restore continue bit-identically; a bad token or a context overflow leaves the slot alone;
//   - the KV cache in pages (16 positions here, so every test's sessions cross page boundaries): sessions growing
//     across pages keep the reference's greedy tokens, a pool too small for a request refuses it with
//     kResourceExhausted leaving its slot and the other sessions alone and serves it after a release, clone and
//     restore into pages taken in another order continue bit-identically, and refuse cleanly on a full pool.
//   - a prompt run as runs of tokens per pass gives the bits of the same prompt a token per pass; as prompt passes
//     (run_prompt, with attention_prompt) it agrees within the tolerance and keeps the greedy tokens.
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
#include "gpu/memory/state_slots.h"
#include "tests/core/engine/engine_test_util.h"
#include "tests/core/engine/tiny_models.h"
#include "tests/gpu/cuda_hidden_check.h"

namespace kestrel {
namespace {

constexpr float kRelTol = 2e-3f;
constexpr int kCtx = 160;
constexpr int kPage = 16;  // KV positions per page in these tests (the engine's default is 256)

bool have_device() { return gpu::cuda_unavailable_reason().empty(); }

using test::rel_diff;

class CudaEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
    const std::string& name = GetParam();
    const std::string path = test::model_path(name);
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
    o.kv_page_tokens = kPage;
    auto c = gpu::make_cuda_engine(*model_, o);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    cuda_ = std::move(*c);
    std::printf("[ %s ] %s\n", name.c_str(), cuda_->layout_summary().c_str());
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
  float worst = 0.0f;
  ASSERT_NO_FATAL_FAILURE(test::expect_hidden_states_match_reference(*model_, *cuda_, kCtx, kRelTol, &worst));
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

// A prompt fed 32 tokens a step runs as runs of 32 tokens in ordinary passes (gdn_runs, attention over rows of one
// slot); token by token it runs a pass per token on the decode kernels. Both must give the same bits: the logits
// after the prompt and the whole state (snapshot bytes). A prompt sharing its passes with decode tokens of other
// sessions leaves theirs as they are alone. And the reference agrees within the tolerance after 75 tokens.
TEST_P(CudaEngineTest, PromptRunsGiveTheBitsOfTokenByToken) {
  Engine& e = *cuda_;
  const std::vector<int32_t> prompt = test::iota_tokens(75, 17, 29);
  auto a = e.slot_alloc(kCtx);
  auto b = e.slot_alloc(kCtx);
  ASSERT_TRUE(a && b);
  std::vector<float> whole;
  for (size_t t0 = 0; t0 < prompt.size(); t0 += 32) {
    whole =
        test::run_one(e, *a, std::span<const int32_t>(prompt).subspan(t0, std::min<size_t>(32, prompt.size() - t0)));
  }
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

// A prompt of more tokens than a pass's rows runs as prompt passes (ForwardPass::run_prompt: up to
// kPromptPassMaxTokens tokens, the projections as gemm_imma or 32 rows a GEMV call, attention_prompt, the GDN layers
// chunked, the MoE one grouped call); fed 32 tokens a step it runs as ordinary passes (the decode kernels). The two
// differ by f32 rounding only: logits within the tolerance of each other and of the reference, the same greedy tokens
// after, and a prompt pass repeated gives the same bits. 300 tokens: one prompt pass; 2000: four, the later ones
// crossing many KV pages.
TEST_P(CudaEngineTest, PromptPassesMatchShortPasses) {
  const uint32_t train = model_->hparams().n_ctx_train;
  gpu::CudaEngineOptions o;
  o.max_slots = 3;
  o.n_ctx = train > 0 && train < 2016 ? static_cast<int32_t>(train) : 2016;
  o.kv_page_tokens = kPage;
  auto c = gpu::make_cuda_engine(*model_, o);
  ASSERT_TRUE(c.has_value()) << c.error().to_string();
  Engine& e = **c;
  ASSERT_GT(e.capabilities().max_tokens_per_item, 32) << "the engine takes prompt chunks larger than a pass";
  int ran = 0;
  for (const int len : {300, 2000}) {
    const int n_ctx = len + 16;     // the prompt and the greedy tokens after it
    if (n_ctx > o.n_ctx) continue;  // the model's context is shorter
    SCOPED_TRACE(std::to_string(len) + "-token prompt");
    ++ran;
    const std::vector<int32_t> prompt = test::iota_tokens(len, 5, 31);
    auto a = e.slot_alloc(n_ctx);
    auto b = e.slot_alloc(n_ctx);
    auto a2 = e.slot_alloc(n_ctx);
    ASSERT_TRUE(a && b && a2);
    std::vector<float> whole = test::run_one(e, *a, prompt);
    EXPECT_EQ(test::run_one(e, *a2, prompt), whole) << "a repeated prompt pass differs";
    std::vector<float> pieces;
    for (size_t t0 = 0; t0 < prompt.size(); t0 += 32) {
      pieces =
          test::run_one(e, *b, std::span<const int32_t>(prompt).subspan(t0, std::min<size_t>(32, prompt.size() - t0)));
    }
    const float d_pieces = rel_diff(whole, pieces);
    EXPECT_LE(d_pieces, kRelTol) << "prompt passes against passes of 32";
    auto r = ref_->slot_alloc(n_ctx);
    ASSERT_TRUE(r);
    std::vector<float> rl = test::run_one(*ref_, *r, prompt);
    const float d_ref = rel_diff(whole, rl);
    std::printf("[ %s ] %d-token prompt: logits max rel diff %.3g to passes of 32, %.3g to the reference\n",
                GetParam().c_str(), len, d_pieces, d_ref);
    EXPECT_LE(d_ref, kRelTol);
    // Greedy tokens after the prompt: the same from the prompt passes, the passes of 32 and the reference.
    for (int step = 0; step < 8; ++step) {
      const int32_t want = test::argmax(rl);
      ASSERT_EQ(test::argmax(whole), want) << "greedy token " << step << " after the prompt passes";
      ASSERT_EQ(test::argmax(pieces), want) << "greedy token " << step << " after the passes of 32";
      const int32_t tok[1] = {want};
      whole = test::run_one(e, *a, tok);
      pieces = test::run_one(e, *b, tok);
      rl = test::run_one(*ref_, *r, tok);
    }
    for (const SlotId s : {*a, *b, *a2}) e.slot_free(s);
    ref_->slot_free(*r);
  }
  if (ran == 0) GTEST_SKIP() << "the model's context is shorter than 300 tokens";
}

// A session crossing pages, a second session refused by a full pool while the first runs on, then served after the
// first is freed; greedy tokens equal to the reference engine's throughout.
TEST_P(CudaEngineTest, KvPagesGrowAndAFullPoolRefusesCleanly) {
  constexpr int kSmallPage = 8;
  const uint64_t page_bytes = gpu::StateSlots::kv_bytes_per_page(model_->hparams(), kSmallPage);
  ASSERT_GT(page_bytes, 0u);
  gpu::CudaEngineOptions o;
  o.max_slots = 4;
  o.n_ctx = kCtx;
  o.kv_page_tokens = kSmallPage;
  o.kv_cache_bytes = 6 * page_bytes + page_bytes / 2;  // whole pages: 6 (48 tokens)
  auto made = gpu::make_cuda_engine(*model_, o);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  gpu::CudaEngine& e = **made;
  EXPECT_EQ(e.kv_cache().page_tokens, kSmallPage);
  EXPECT_EQ(e.kv_cache().page_bytes, page_bytes);
  EXPECT_EQ(e.kv_cache().n_pages, 6);
  EXPECT_EQ(e.kv_cache().free_pages, 6);
  EXPECT_GE(e.state_bytes(), 6 * page_bytes);
  EXPECT_EQ(e.capabilities().max_slot_ctx, kCtx) << "a session may still ask for the whole context";
  // cache_pool() (status and metrics, read from other threads) follows the allocator after every call.
  EXPECT_EQ(e.cache_pool().tokens_total, 6 * kSmallPage);
  EXPECT_EQ(e.cache_pool().bytes, 6 * page_bytes);
  auto pool_agrees = [&] { return e.cache_pool().tokens_held == (6 - e.kv_cache().free_pages) * kSmallPage; };
  EXPECT_EQ(e.cache_pool().tokens_held, 0);

  // Session a grows from 5 to 36 tokens (pages 1..5), its greedy tokens the reference's.
  auto a = e.slot_alloc(kCtx);
  auto ra = ref_->slot_alloc(kCtx);
  ASSERT_TRUE(a && ra);
  const std::vector<int32_t> prompt = test::iota_tokens(5, 3, 17);
  std::vector<float> cl = test::run_one(e, *a, prompt), rl = test::run_one(*ref_, *ra, prompt);
  EXPECT_EQ(e.kv_cache().free_pages, 5);
  while (e.slot_n_past(*a) < 35) {
    const int32_t t = test::argmax(rl);
    ASSERT_EQ(test::argmax(cl), t) << "greedy token at position " << e.slot_n_past(*a);
    const int32_t tok[1] = {t};
    cl = test::run_one(e, *a, tok);
    rl = test::run_one(*ref_, *ra, tok);
    EXPECT_EQ(e.kv_cache().free_pages, 6 - (e.slot_n_past(*a) + kSmallPage - 1) / kSmallPage);
  }
  EXPECT_LE(rel_diff(cl, rl), kRelTol);
  EXPECT_EQ(e.kv_cache().free_pages, 1);
  EXPECT_TRUE(pool_agrees());

  // Session b's 16-token prompt needs 2 pages, 1 is free: refused, while a's token in the same tick runs.
  auto b = e.slot_alloc(kCtx);
  ASSERT_TRUE(b);
  const std::vector<int32_t> b_prompt = test::iota_tokens(16, 20, 29);
  int32_t a_tok[1] = {test::argmax(rl)};
  ASSERT_EQ(test::argmax(cl), a_tok[0]);
  test::TickResult tick = test::run_tick(e, {{*b, b_prompt}, {*a, a_tok}});
  ASSERT_FALSE(tick.status[0]) << "a prompt the pool cannot hold";
  EXPECT_EQ(tick.status[0].error().code, ErrorCode::kResourceExhausted);
  const std::string& why = tick.status[0].error().message;
  EXPECT_NE(why.find("16 tokens"), std::string::npos) << why;
  EXPECT_NE(why.find("bytes"), std::string::npos) << why;
  EXPECT_EQ(e.slot_n_past(*b), 0) << "the refused session moved";
  ASSERT_TRUE(tick.status[1]) << tick.status[1].error().to_string();
  rl = test::run_one(*ref_, *ra, a_tok);
  EXPECT_EQ(test::argmax(tick.logits[1]), test::argmax(rl)) << "the other session of the tick";
  EXPECT_LE(rel_diff(tick.logits[1], rl), kRelTol);
  EXPECT_EQ(e.slot_n_past(*a), 36);
  EXPECT_EQ(e.kv_cache().free_pages, 1) << "the refused item took pages";
  EXPECT_TRUE(pool_agrees());
  // Clone and restore into b need 5 pages: refused, b unchanged.
  auto snap = e.slot_snapshot(*a);
  ASSERT_TRUE(snap.has_value()) << snap.error().to_string();
  EXPECT_EQ(e.slot_clone(*a, *b).error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(e.slot_restore(*b, *snap).error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(e.slot_n_past(*b), 0);
  EXPECT_EQ(e.kv_cache().free_pages, 1);

  // After a is freed the same prompt runs, and b decodes the reference's tokens across pages.
  e.slot_free(*a);
  EXPECT_EQ(e.kv_cache().free_pages, 6);
  EXPECT_EQ(e.cache_pool().tokens_held, 0);
  auto rb = ref_->slot_alloc(kCtx);
  ASSERT_TRUE(rb);
  cl = test::run_one(e, *b, b_prompt);
  rl = test::run_one(*ref_, *rb, b_prompt);
  ASSERT_FALSE(cl.empty());
  for (int step = 0; step < 24; ++step) {
    const int32_t t = test::argmax(rl);
    ASSERT_EQ(test::argmax(cl), t) << "session b's greedy token " << step;
    const int32_t tok[1] = {t};
    cl = test::run_one(e, *b, tok);
    rl = test::run_one(*ref_, *rb, tok);
  }
  EXPECT_EQ(e.kv_cache().free_pages, 1);  // 40 tokens: 5 pages
  // The snapshot of a (36 tokens) restores into a fresh slot now that its pages are free.
  auto c = e.slot_alloc(kCtx);
  ASSERT_TRUE(c);
  e.slot_reset(*b);
  EXPECT_EQ(e.kv_cache().free_pages, 6);
  ASSERT_TRUE(e.slot_restore(*c, *snap));
  EXPECT_EQ(e.slot_n_past(*c), 36);
  EXPECT_EQ(e.kv_cache().free_pages, 1);
  EXPECT_TRUE(pool_agrees());
  // A context overflow stays kOutOfRange, not a pool error.
  const std::vector<int32_t> too_long = test::iota_tokens(kCtx, 1, 1);
  EXPECT_EQ(e.check({*c, too_long}).error().code, ErrorCode::kOutOfRange);
}

// Clone and snapshot/restore of sessions spanning several pages continue bit-identically, with the copies' pages
// taken in another order from the pool.
TEST_P(CudaEngineTest, CloneAndRestoreAcrossPagesContinueBitIdentically) {
  gpu::CudaEngine& e = *cuda_;
  auto a = e.slot_alloc(kCtx);
  ASSERT_TRUE(a);
  // Another session takes pages between a's, so a's pages are not consecutive in the pool.
  auto other = e.slot_alloc(kCtx);
  ASSERT_TRUE(other);
  const std::vector<int32_t> prompt = test::iota_tokens(kPage + 3, 7, 11);
  const std::vector<int32_t> other_prompt = test::iota_tokens(2 * kPage, 50, 13);
  ASSERT_TRUE(test::run_tick(e, {{*a, prompt}, {*other, other_prompt}}).status[0]);
  std::vector<float> la = test::run_one(e, *a, std::span<const int32_t>(prompt).first(1));
  ASSERT_FALSE(la.empty());
  ASSERT_TRUE(test::run_tick(e, {{*other, other_prompt}}).status[0]);
  for (int i = 0; i < kPage; ++i) {
    const int32_t tok[1] = {test::argmax(la)};
    la = test::run_one(e, *a, tok);
  }
  ASSERT_EQ(e.slot_n_past(*a), 2 * kPage + 4);  // three pages

  // Fork: c is a clone, d a restore of the snapshot in a slot allocated after other pages were freed and taken.
  auto snap = e.slot_snapshot(*a);
  ASSERT_TRUE(snap.has_value()) << snap.error().to_string();
  auto c = e.slot_alloc(kCtx);
  ASSERT_TRUE(c);
  ASSERT_TRUE(e.slot_clone(*a, *c));
  e.slot_free(*other);
  auto d = e.slot_alloc(kCtx);
  ASSERT_TRUE(d);
  ASSERT_TRUE(e.slot_restore(*d, *snap));
  EXPECT_EQ(e.slot_n_past(*d), e.slot_n_past(*a));
  // 2 pages further, all three in one tick each step: the same bits.
  for (int step = 0; step < 2 * kPage; ++step) {
    const int32_t tok[1] = {test::argmax(la)};
    test::TickResult r = test::run_tick(e, {{*a, tok}, {*c, tok}, {*d, tok}});
    ASSERT_TRUE(r.status[0] && r.status[1] && r.status[2]);
    ASSERT_EQ(r.logits[1], r.logits[0]) << "the clone diverged at step " << step;
    ASSERT_EQ(r.logits[2], r.logits[0]) << "the restored snapshot diverged at step " << step;
    la = r.logits[0];
  }
  // The reference engine continues the same snapshot to the same greedy token.
  auto r = ref_->slot_alloc(kCtx);
  ASSERT_TRUE(r);
  ASSERT_TRUE(ref_->slot_restore(*r, *snap));
  auto rc = e.slot_alloc(kCtx);
  ASSERT_TRUE(rc);
  ASSERT_TRUE(e.slot_restore(*rc, *snap));
  const int32_t tok[1] = {5};
  const std::vector<float> want = test::run_one(*ref_, *r, tok), got = test::run_one(e, *rc, tok);
  EXPECT_LE(rel_diff(got, want), kRelTol);
  EXPECT_EQ(test::argmax(got), test::argmax(want));
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineTest,
                         ::testing::Values("golden-qwen35moe", "golden-qwen35", "golden-qwen3next", "tiny",
                                           "tiny-qwen3next", "tiny-qwen35", "tiny-qwen3next-legacy", "tiny-imma",
                                           "tiny-wide"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(CudaEngine, RefusesWhatDoesNotFit) {
  if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
  auto m = Model::open(test::fixture_model_path("golden-qwen35moe"));
  ASSERT_TRUE(m.has_value());
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  gpu::CudaEngineOptions o;
  o.n_ctx = static_cast<int32_t>((*m)->hparams().n_ctx_train);
  o.kv_cache_bytes = 2 * static_cast<uint64_t>(total_b);  // a KV cache twice the device
  auto e = gpu::make_cuda_engine(**m, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(e.error().message.find("free"), std::string::npos) << "names what is free: " << e.error().message;
  EXPECT_NE(e.error().message.find("KV cache"), std::string::npos) << e.error().message;
  o.kv_cache_bytes = 1;  // less than a page
  EXPECT_EQ(gpu::make_cuda_engine(**m, o).error().code, ErrorCode::kInvalidArgument);
  o.kv_cache_bytes = 0;
  o.kv_page_tokens = 48;  // not a power of two
  EXPECT_EQ(gpu::make_cuda_engine(**m, o).error().code, ErrorCode::kInvalidArgument);
  o.kv_page_tokens = 256;
  o.max_slots = 0;
  EXPECT_EQ(gpu::make_cuda_engine(**m, o).error().code, ErrorCode::kInvalidArgument);
  // The automatic pool: every slot at n_ctx when the device holds that (it does, for this tiny model).
  o.max_slots = 3;
  o.n_ctx = 1000;
  auto ok = gpu::make_cuda_engine(**m, o);
  ASSERT_TRUE(ok.has_value()) << ok.error().to_string();
  EXPECT_EQ((*ok)->kv_cache().page_tokens, 256);
  EXPECT_EQ((*ok)->kv_cache().n_pages, 3 * 4) << "3 slots of ceil(1000 / 256) pages";
}

}  // namespace
}  // namespace kestrel
