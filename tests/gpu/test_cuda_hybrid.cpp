// The CUDA engine with routed experts on the host (issue 32): the hybrid MoE layers of the graphed decode pass
// (gpu/engine/forward_pass.h) with the CPU ExpertBackend (cpu/expert_backend.h) computing the experts the placement
// leaves on the host, against the reference engine, on the golden fixtures and the tiny MoE presets (a Q4_0 tiny
// model with the shared ff equal to the experts' takes the moe_imma path; the rest moe_forward's), under placements:
//   - "cpu": every routed expert on the host (no routed-expert kernel on the GPU);
//   - "half": the routed experts of the first half of the MoE layers on the host (the planner's --n-cpu-moe);
//   - "split": one layer split expert by expert (the even ids on the GPU), one layer with a single resident expert,
//     and the others on the GPU.
// Checks:
//   - greedy tokens identical to the reference's for 64 steps after a prompt, logits within the tolerance below, and
//     per-layer residual streams (the per-layer pass, launched kernel by kernel outside a graph) within it;
//   - the weights on the GPU are exactly the plan's bytes (PlacementDecision::gpu_bytes, alignment aside);
//   - with the default int8 backend: bit-identical logits across runs and between a session alone and in a batch of
//     8 with others at other positions; a prompt run as a prompt pass (all its rows in one hand-off) repeats its
//     bits and agrees with the same prompt fed 32 tokens a step within kInt8PassTol, with the same greedy token;
//   - a prompt pass long enough to upload the host experts (gpu/engine/expert_upload.h) gives the all-GPU engine's
//     bits (moe_imma models; raw-block ones skip), a shorter one the host's;
//   - the side read (moe_hybrid.h step 3b; moe_imma models), at shares 1 and 0.5 of each token's host choices over the
//     bus: greedy tokens and logits as above, bit-identical across runs and batches;
//   - an error of the backend on the hand-off thread fails that step with its message, and the engine steps again
//     after it; a backend that holds the wrong experts, or none, is refused at creation;
//   - hybrid::make_placed_cuda_engine (what kestreld builds): a budget too small for the dense weights is refused
//     with their bytes; --n-cpu-moe over every MoE layer gives an engine that matches the reference, its experts
//     page-locked, its upload threshold and side-read share from the cost model; a budget that splits the experts takes
//     routing counts from a calibration prompt (the GPU holding the most-chosen ones), keeps them and reads them back
//     on the next start.
// Tolerance: the CUDA engine's (test_cuda_engine.cpp): max|Δ| ≤ 2e-3 · max(1, max|ref|) per row. The hybrid layer adds
// to the all-GPU engine's differences the CPU GEMVs' summation order (~1e-7 relative per product, f32 activations)
// and one more f32 rounding where the host partial joins the device's (moe_hybrid.h) — the same order of magnitude,
// far below what a wrong expert, weight or join gives (O(1) of the row's scale).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/engine/expert_backend.h"
#include "core/engine/placement_planner.h"
#include "core/engine/reference_engine.h"
#include "core/engine/routing_counts.h"
#include "core/model/model.h"
#include "core/reference/forward.h"
#include "core/reference/model_weights.h"
#include "cpu/expert_backend.h"
#include "gpu/engine/cuda_engine.h"
#include "gpu/memory/pinned_experts.h"
#include "hybrid/placed_cuda_engine.h"
#include "tests/core/engine/engine_test_util.h"
#include "tests/core/engine/tiny_models.h"
#include "tests/gpu/cuda_hidden_check.h"

namespace kestrel {
namespace {

constexpr float kRelTol = 2e-3f;
// The int8 backend rounds each activation to 1/127 of its 32-element block's largest: two runs whose inputs differ by
// f32 rounding (a prompt pass's chunked delta rule and GEMM against passes of 32) put some activations on neighbouring
// steps. Measured: 0.2-0.4% of the logits' scale with every expert on the host, against the int8 path's own 3-7% from
// the reference (both on the golden fixtures); a wrong expert or join moves them by O(1).
constexpr float kInt8PassTol = 1e-2f;
constexpr int kCtx = 160;
constexpr int kGreedySteps = 64;

bool have_device() { return gpu::cuda_unavailable_reason().empty(); }

std::vector<uint32_t> moe_layers(const ModelHparams& hp, const PlacementDecision& d) {
  std::vector<uint32_t> out;
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (!d.expert_on_gpu[l].empty()) out.push_back(l);
  }
  return out;
}

// The placement of a name: planned with an ample budget (every expert on the GPU), then changed as described in
// the file head. The bandwidths only feed the cost model.
PlacementDecision make_placement(const Model& m, const std::string& placement) {
  const PlannerModel pm = planner_model(m.catalog());
  PlacementRequest r;
  r.has_gpu = true;
  r.gpu_budget = uint64_t{1} << 40;
  r.gpu_read_bytes_per_s = 3e12;
  r.host_read_bytes_per_s = 1e11;
  if (placement == "half") {
    auto all = plan_placement(pm, r);
    EXPECT_TRUE(all.has_value());
    r.n_cpu_moe = static_cast<int32_t>(moe_layers(m.hparams(), *all).size() / 2);
  }
  auto d = plan_placement(pm, r);
  EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().to_string());
  if (!d) return {};
  const std::vector<uint32_t> moe = moe_layers(m.hparams(), *d);
  auto set = [&](uint32_t layer, auto on) {
    uint64_t layer_bytes = 0;  // the layer's three expert stacks
    for (const PlannerTensor& t : pm.tensors) {
      if (t.placement == PlacementClass::kRoutedExperts && t.layer == static_cast<int32_t>(layer)) {
        layer_bytes += t.bytes;
      }
    }
    const uint64_t slice = layer_bytes / m.hparams().n_expert;  // one expert's three slices
    std::vector<uint8_t>& row = d->expert_on_gpu[layer];
    for (size_t e = 0; e < row.size(); ++e) {
      const uint8_t want = on(e) ? 1 : 0;
      if (row[e] == want) continue;
      d->gpu_bytes = want ? d->gpu_bytes + slice : d->gpu_bytes - slice;
      d->host_bytes = want ? d->host_bytes - slice : d->host_bytes + slice;
      row[e] = want;
    }
  };
  if (placement == "cpu") {
    for (uint32_t l : moe) set(l, [](size_t) { return false; });
  } else if (placement == "split") {
    set(moe[0], [](size_t e) { return e % 2 == 0; });
    set(moe[moe.size() / 2], [](size_t e) { return e == 3; });
  }
  return *d;
}

std::unique_ptr<cpu::CpuExpertBackend> make_backend(const Model& m, const PlacementDecision& d,
                                                    cpu::CpuActivations act) {
  cpu::CpuExpertBackendOptions o;
  o.threads = 2;
  o.pin = false;
  o.activations = act;
  auto b = cpu::make_cpu_expert_backend(m, ExpertSet::on_device(d, WeightDevice::kHost), o);
  EXPECT_TRUE(b.has_value()) << (b ? "" : b.error().to_string());
  return b ? std::move(*b) : nullptr;
}

// upload_min_tokens: prompt passes from this many tokens stage the host experts on the GPU (0: never, so the tests of
// the host hand-off see it in prompt passes too).
// side_read: GpuTuning::expert_side_read (it needs `pinned`).
std::unique_ptr<gpu::CudaEngine> make_engine(const Model& m, const PlacementDecision& d,
                                             std::shared_ptr<ExpertBackend> backend, int upload_min_tokens = 0,
                                             std::shared_ptr<const gpu::PinnedExperts> pinned = nullptr,
                                             float side_read = 0.0f) {
  gpu::CudaEngineOptions o;
  o.max_slots = 10;
  o.n_ctx = kCtx;
  o.tuning.expert_upload_min_tokens = upload_min_tokens;
  o.tuning.expert_side_read = side_read;
  o.placement = d;
  o.expert_backend = std::move(backend);
  o.pinned_experts = std::move(pinned);
  auto e = gpu::make_cuda_engine(m, o);
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().to_string());
  return e ? std::move(*e) : nullptr;
}

using test::rel_diff;

// A backend that forwards to another and fails its batches while `fail` is set.
class FaultyBackend final : public ExpertBackend {
 public:
  explicit FaultyBackend(std::unique_ptr<ExpertBackend> inner) : inner_(std::move(inner)) {}
  const ExpertSet& experts() const override { return inner_->experts(); }
  int32_t hidden() const override { return inner_->hidden(); }
  Status check(const ExpertBatch& b) const override { return inner_->check(b); }
  Status run(const ExpertBatch& b) override {
    if (fail.load()) return make_error(ErrorCode::kInternal, "injected expert backend failure");
    return inner_->run(b);
  }
  std::atomic<bool> fail{false};

 private:
  std::unique_ptr<ExpertBackend> inner_;
};

// The engine's greedy tokens against the reference's for kGreedySteps steps after a 12-token prompt, in a slot of
// each freed after (a fatal failure at the first token that differs); the largest logits rel diff seen in *worst,
// the one after the prompt in *after_prompt.
void greedy_against_reference(Engine& ref, Engine& e, const std::string& what, float* worst, float* after_prompt) {
  const std::vector<int32_t> prompt = test::iota_tokens(12);
  auto rs = ref.slot_alloc(kCtx);
  auto cs = e.slot_alloc(kCtx);
  ASSERT_TRUE(rs && cs);
  std::vector<float> rl = test::run_one(ref, *rs, prompt);
  std::vector<float> cl = test::run_one(e, *cs, prompt);
  *after_prompt = rel_diff(cl, rl);
  *worst = *after_prompt;
  for (int step = 0; step < kGreedySteps; ++step) {
    const int32_t rt = test::argmax(rl);
    ASSERT_EQ(test::argmax(cl), rt) << what << ": greedy token " << step << " differs";
    const int32_t tok[1] = {rt};
    rl = test::run_one(ref, *rs, tok);
    cl = test::run_one(e, *cs, tok);
    *worst = std::max(*worst, rel_diff(cl, rl));
  }
  ref.slot_free(*rs);
  e.slot_free(*cs);
}

struct Case {
  std::string model;
  std::string placement;
};

class CudaHybridTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
    const std::string path = test::model_path(GetParam().model);
    ASSERT_FALSE(path.empty());
    auto m = Model::open(path);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    model_ = std::move(*m);
    auto r = make_reference_engine(*model_, 4);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    ref_ = std::move(*r);
    decision_ = make_placement(*model_, GetParam().placement);
    ASSERT_FALSE(decision_.expert_on_gpu.empty());
  }

  std::string what() const { return GetParam().model + "/" + GetParam().placement; }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> ref_;
  PlacementDecision decision_;
};

TEST_P(CudaHybridTest, GreedyTokensAndLogitsMatchTheReference) {
  std::unique_ptr<gpu::CudaEngine> e =
      make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kF32));
  ASSERT_NE(e, nullptr);
  std::printf("[ %s ] %s; %s\n", what().c_str(), e->layout_summary().c_str(), e->placement().summary.c_str());
  EXPECT_EQ(e->weight_bytes_unpadded(), decision_.gpu_bytes) << "the GPU holds other bytes than the plan's";
  EXPECT_GT(e->hybrid_layers(), 0);
  if (GetParam().placement == "cpu") {
    EXPECT_EQ(e->host_expert_layers(), e->hybrid_layers());
  }
  EXPECT_NE(e->placement().device.find("+ cpu experts"), std::string::npos) << e->placement().device;

  float worst = 0.0f, after_prompt = 0.0f;
  ASSERT_NO_FATAL_FAILURE(greedy_against_reference(*ref_, *e, what(), &worst, &after_prompt));
  EXPECT_LE(after_prompt, kRelTol) << "logits after the prompt";
  EXPECT_LE(worst, kRelTol);
  std::printf("[ %s ] %d greedy tokens equal; logits max rel diff %.3g (tolerance %.1g)\n", what().c_str(),
              kGreedySteps, worst, kRelTol);
}

TEST_P(CudaHybridTest, PerLayerHiddenStatesMatchTheReference) {
  std::unique_ptr<gpu::CudaEngine> e =
      make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kF32));
  ASSERT_NE(e, nullptr);
  float worst = 0.0f;
  ASSERT_NO_FATAL_FAILURE(test::expect_hidden_states_match_reference(*model_, *e, kCtx, kRelTol, &worst));
  std::printf("[ %s ] per-layer hidden max rel diff %.3g\n", what().c_str(), worst);
}

// A session's logits after a 7-token prompt and one more token: the same bits from a reset slot, and in a batch of 8
// with sessions at other positions.
void expect_bits_repeat_and_ignore_the_batch(Engine& e, const std::string& what) {
  const std::vector<int32_t> prompt = test::iota_tokens(7, 5, 13);
  const int32_t next[1] = {42};
  auto a = e.slot_alloc(kCtx);
  ASSERT_TRUE(a);
  test::run_one(e, *a, prompt);
  const std::vector<float> alone = test::run_one(e, *a, next);
  e.slot_reset(*a);
  test::run_one(e, *a, prompt);
  EXPECT_EQ(test::run_one(e, *a, next), alone) << what << ": a repeated run differs";
  e.slot_reset(*a);
  std::vector<EngineStepItem> items = {{*a, prompt}};
  const int32_t other_tok[1] = {77};
  for (int i = 0; i < 7; ++i) {
    auto s = e.slot_alloc(kCtx);
    ASSERT_TRUE(s);
    test::run_one(e, *s, test::iota_tokens(1 + i, 100 + i, 3));
    items.push_back({*s, other_tok});
  }
  ASSERT_TRUE(test::run_tick(e, items).status[0]);
  items[0].tokens = next;
  test::TickResult batch = test::run_tick(e, items);
  ASSERT_TRUE(batch.status[0]);
  EXPECT_EQ(batch.logits[0], alone) << what << ": a session's logits depend on the batch";
}

TEST_P(CudaHybridTest, BitIdenticalAcrossRunsAndBatches) {
  std::unique_ptr<gpu::CudaEngine> e =
      make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kInt8));
  ASSERT_NE(e, nullptr);
  expect_bits_repeat_and_ignore_the_batch(*e, what());
}

// A prompt longer than a pass runs as one prompt pass, each hybrid layer handing all its rows to the host at once
// (moe_imma_prompt; raw-block layers 32 rows a hand-off): with the int8 backend, the same bits when repeated and within
// kInt8PassTol of the prompt fed 32 tokens a step (attention_prompt, gemm_imma and gdn_chunked round differently);
// with the f32 backend, within the tolerance of the reference.
TEST_P(CudaHybridTest, PromptPassesMatchShortPasses) {
  const std::vector<int32_t> prompt = test::iota_tokens(150, 9, 17);
  {
    std::unique_ptr<gpu::CudaEngine> e =
        make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kInt8));
    ASSERT_NE(e, nullptr);
    auto a = e->slot_alloc(kCtx);
    auto b = e->slot_alloc(kCtx);
    auto a2 = e->slot_alloc(kCtx);
    ASSERT_TRUE(a && b && a2);
    const std::vector<float> whole = test::run_one(*e, *a, prompt);
    EXPECT_EQ(test::run_one(*e, *a2, prompt), whole) << "a repeated prompt pass differs";
    std::vector<float> pieces;
    for (size_t t0 = 0; t0 < prompt.size(); t0 += 32) {
      pieces =
          test::run_one(*e, *b, std::span<const int32_t>(prompt).subspan(t0, std::min<size_t>(32, prompt.size() - t0)));
    }
    auto r8 = ref_->slot_alloc(kCtx);
    ASSERT_TRUE(r8);
    const float d_pieces = rel_diff(whole, pieces);
    const float d_ref8 = rel_diff(whole, test::run_one(*ref_, *r8, prompt));
    std::printf("[ %s ] int8 backend, 150-token prompt pass: %.3g to passes of 32, %.3g to the reference\n",
                what().c_str(), d_pieces, d_ref8);
    EXPECT_LE(d_pieces, kInt8PassTol) << "prompt pass against passes of 32";
    EXPECT_EQ(test::argmax(whole), test::argmax(pieces));
  }
  std::unique_ptr<gpu::CudaEngine> e =
      make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kF32));
  ASSERT_NE(e, nullptr);
  auto c = e->slot_alloc(kCtx);
  auto r = ref_->slot_alloc(kCtx);
  ASSERT_TRUE(c && r);
  const float d = rel_diff(test::run_one(*e, *c, prompt), test::run_one(*ref_, *r, prompt));
  std::printf("[ %s ] 150-token prompt pass: logits max rel diff %.3g\n", what().c_str(), d);
  EXPECT_LE(d, kRelTol);
}

// A prompt pass long enough to upload (expert_upload.h): the hybrid layers run on their experts copied and tiled on
// the GPU, so the prompt's logits are bit-identical to an engine with every expert on the GPU; shorter passes still
// hand the host its experts' rows.
TEST_P(CudaHybridTest, UploadedPromptPassesMatchTheAllGpuEngine) {
  const std::vector<int32_t> prompt = test::iota_tokens(150, 9, 17);
  std::unique_ptr<gpu::CudaEngine> e =
      make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kInt8), 100);
  ASSERT_NE(e, nullptr);
  const std::string layout = e->layout_summary();
  std::printf("[ %s ] %s\n", what().c_str(), layout.c_str());
  if (layout.find("no hybrid layer runs on moe_imma") != std::string::npos) {
    GTEST_SKIP() << "raw-block MoE layers: their prompt passes hand the host its rows (PromptPassesMatchShortPasses)";
  }
  ASSERT_NE(layout.find("prompt passes: from 100 tokens"), std::string::npos) << layout;
  std::unique_ptr<gpu::CudaEngine> all_gpu = make_engine(*model_, make_placement(*model_, "gpu"), nullptr);
  ASSERT_NE(all_gpu, nullptr);
  auto a = e->slot_alloc(kCtx);
  auto a2 = e->slot_alloc(kCtx);
  auto g = all_gpu->slot_alloc(kCtx);
  ASSERT_TRUE(a && a2 && g);
  const std::vector<float> uploaded = test::run_one(*e, *a, prompt);
  EXPECT_EQ(uploaded, test::run_one(*all_gpu, *g, prompt)) << "uploaded experts against the all-GPU engine";
  EXPECT_EQ(test::run_one(*e, *a2, prompt), uploaded) << "a repeated uploaded prompt pass differs";
  // 99 tokens: below the threshold, the host's rows (int8 activations), near but not equal.
  auto b = e->slot_alloc(kCtx);
  auto h = all_gpu->slot_alloc(kCtx);
  ASSERT_TRUE(b && h);
  const std::span<const int32_t> short_prompt = std::span<const int32_t>(prompt).first(99);
  const float d = rel_diff(test::run_one(*e, *b, short_prompt), test::run_one(*all_gpu, *h, short_prompt));
  std::printf("[ %s ] 99-token prompt pass on the host experts: %.3g to the all-GPU engine\n", what().c_str(), d);
  EXPECT_GT(d, 0.0f) << "a pass below the threshold ran on uploaded experts";
}

// The hybrid layers' stacks copied to page-locked memory (what make_placed_cuda_engine does when uploads are on): the
// copy holds the file's bytes, prompt passes upload straight from it and the backend reads it, with the results of
// the engine that reads the file mapping — bit for bit, above the upload threshold and below it.
TEST_P(CudaHybridTest, PageLockedExpertsGiveTheMappedEnginesResults) {
  const WeightCatalog& catalog = model_->catalog();
  const ExpertSet host = ExpertSet::on_device(decision_, WeightDevice::kHost);
  const std::vector<bool> layers = host.layers();
  auto made = gpu::PinnedExperts::create(*model_, layers, 3);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  std::shared_ptr<const gpu::PinnedExperts> pinned = std::move(*made);
  ASSERT_GT(pinned->bytes(), 0u);
  auto views = cpu::expert_weight_views(*model_);
  ASSERT_TRUE(views.has_value());
  std::vector<ref::MoeWeights> moe = std::move(*views);
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l]) continue;
    const FfnWeights& f = catalog.layer(static_cast<uint32_t>(l)).ffn;
    const gpu::PinnedExperts::Layer& p = pinned->layer(l);
    ASSERT_NE(p.gate, nullptr) << "layer " << l;
    EXPECT_EQ(std::memcmp(p.gate, f.gate_exps.data.data(), f.gate_exps.data.size()), 0) << "layer " << l;
    EXPECT_EQ(std::memcmp(p.up, f.up_exps.data.data(), f.up_exps.data.size()), 0) << "layer " << l;
    EXPECT_EQ(std::memcmp(p.down, f.down_exps.data.data(), f.down_exps.data.size()), 0) << "layer " << l;
    moe[l].gate_exps.data = p.gate;
    moe[l].up_exps.data = p.up;
    moe[l].down_exps.data = p.down;
  }
  cpu::CpuExpertBackendOptions bo;
  bo.threads = 2;
  bo.pin = false;
  auto backend = cpu::make_cpu_expert_backend(std::move(moe), host, bo);
  ASSERT_TRUE(backend.has_value()) << backend.error().to_string();
  std::unique_ptr<gpu::CudaEngine> locked = make_engine(*model_, decision_, std::move(*backend), 100, pinned);
  std::unique_ptr<gpu::CudaEngine> mapped =
      make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kInt8), 100);
  ASSERT_NE(locked, nullptr);
  ASSERT_NE(mapped, nullptr);
  const std::string layout = locked->layout_summary();
  std::printf("[ %s ] %s\n", what().c_str(), layout.c_str());
  if (layout.find("no hybrid layer runs on moe_imma") == std::string::npos) {
    EXPECT_NE(layout.find("from page-locked host experts"), std::string::npos) << layout;
  }
  const std::vector<int32_t> prompt = test::iota_tokens(150, 9, 17);
  for (size_t n : {size_t{150}, size_t{99}, size_t{3}}) {
    auto a = locked->slot_alloc(kCtx);
    auto b = mapped->slot_alloc(kCtx);
    ASSERT_TRUE(a && b);
    const std::span<const int32_t> part = std::span<const int32_t>(prompt).first(n);
    EXPECT_EQ(test::run_one(*locked, *a, part), test::run_one(*mapped, *b, part)) << n << "-token prompt";
  }
}

// The side read (moe_hybrid.h step 3b): the hybrid moe_imma layers read a share of each token's host choices over the
// bus from the page-locked copy (share 1: all of them, the host computes nothing; 0.5: both sides). The greedy tokens
// and logits follow the reference within the tolerance (the bus experts' arithmetic is moe_forward's, f32 against
// dequantized weights), repeated runs give the same bits, and a session's bits do not depend on its batch (the split
// is a rule of each token's own choices). Raw-block layers (moe_forward) have no side read: their models skip.
TEST_P(CudaHybridTest, SideReadFollowsTheReferenceAndStaysBatchInvariant) {
  const ExpertSet host = ExpertSet::on_device(decision_, WeightDevice::kHost);
  auto made = gpu::PinnedExperts::create(*model_, host.layers(), 3);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  std::shared_ptr<const gpu::PinnedExperts> pinned = std::move(*made);
  for (float share : {1.0f, 0.5f}) {
    std::unique_ptr<gpu::CudaEngine> e =
        make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kF32), 0, pinned, share);
    ASSERT_NE(e, nullptr);
    const std::string layout = e->layout_summary();
    if (layout.find("side read: off (no hybrid moe_imma layer") != std::string::npos) {
      GTEST_SKIP() << "raw-block MoE layers: no side read (" << layout << ")";
    }
    ASSERT_NE(layout.find("of each token's host choices over the bus"), std::string::npos) << layout;
    std::printf("[ %s ] share %.1f: %s\n", what().c_str(), share, layout.c_str());

    float worst = 0.0f, after_prompt = 0.0f;
    ASSERT_NO_FATAL_FAILURE(
        greedy_against_reference(*ref_, *e, "share " + std::to_string(share), &worst, &after_prompt));
    EXPECT_LE(worst, kRelTol) << "share " << share;
    std::printf("[ %s ] share %.1f: %d greedy tokens equal; logits max rel diff %.3g\n", what().c_str(), share,
                kGreedySteps, worst);

    // The int8 backend (the default; BitIdenticalAcrossRunsAndBatches) for the bits.
    e = make_engine(*model_, decision_, make_backend(*model_, decision_, cpu::CpuActivations::kInt8), 0, pinned, share);
    ASSERT_NE(e, nullptr);
    expect_bits_repeat_and_ignore_the_batch(*e, what() + ", share " + std::to_string(share));
  }
}

TEST_P(CudaHybridTest, BackendErrorsFailTheStepAndTheEngineRecovers) {
  auto inner = make_backend(*model_, decision_, cpu::CpuActivations::kF32);
  ASSERT_NE(inner, nullptr);
  auto faulty = std::make_shared<FaultyBackend>(std::move(inner));
  std::unique_ptr<gpu::CudaEngine> e = make_engine(*model_, decision_, faulty);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = test::iota_tokens(5);
  auto s = e->slot_alloc(kCtx);
  ASSERT_TRUE(s);
  const std::vector<float> good = test::run_one(*e, *s, prompt);  // graphs captured, the backend exercised
  e->slot_reset(*s);
  faulty->fail = true;
  test::TickResult bad = test::run_tick(*e, {{*s, prompt}});
  ASSERT_FALSE(bad.status[0]) << "the backend's error did not surface";
  EXPECT_NE(bad.status[0].error().message.find("injected expert backend failure"), std::string::npos)
      << bad.status[0].error().message;
  faulty->fail = false;
  e->slot_reset(*s);
  EXPECT_EQ(test::run_one(*e, *s, prompt), good) << "the engine does not step as before after the failure";
}

TEST_P(CudaHybridTest, RefusesAWrongOrMissingBackend) {
  gpu::CudaEngineOptions o;
  o.max_slots = 2;
  o.n_ctx = kCtx;
  o.placement = decision_;
  auto none = gpu::make_cuda_engine(*model_, o);
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.error().code, ErrorCode::kInvalidArgument) << none.error().to_string();
  // A backend holding every expert: the GPU's too.
  cpu::CpuExpertBackendOptions bo;
  bo.threads = 1;
  bo.pin = false;
  auto all = cpu::make_cpu_expert_backend(*model_, ExpertSet::all(model_->hparams()), bo);
  ASSERT_TRUE(all.has_value());
  o.expert_backend = std::move(*all);
  auto wrong = gpu::make_cuda_engine(*model_, o);
  if (GetParam().placement == "cpu") {
    EXPECT_TRUE(wrong.has_value()) << "every expert on the host: the backend holding all of them is right";
  } else {
    ASSERT_FALSE(wrong.has_value());
    EXPECT_EQ(wrong.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(wrong.error().message.find("also held by the expert backend"), std::string::npos)
        << wrong.error().message;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* m : {"golden-qwen35moe", "golden-qwen3next", "tiny", "tiny-qwen3next", "tiny-imma"}) {
    for (const char* p : {"cpu", "half", "split"}) out.push_back({m, p});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Placements, CudaHybridTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = i.param.model + "_" + i.param.placement;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A placed engine's greedy tokens and logits against the reference's after a 10-token prompt, for kGreedySteps steps.
void follows_the_reference(const Model& model, Engine& e) {
  auto ref = make_reference_engine(model, 1);
  ASSERT_TRUE(ref.has_value());
  const std::vector<int32_t> prompt = test::iota_tokens(10);
  auto rs = (*ref)->slot_alloc(kCtx);
  auto cs = e.slot_alloc(kCtx);
  ASSERT_TRUE(rs && cs);
  std::vector<float> rl = test::run_one(**ref, *rs, prompt);
  std::vector<float> cl = test::run_one(e, *cs, prompt);
  for (int step = 0; step < kGreedySteps; ++step) {
    ASSERT_EQ(test::argmax(cl), test::argmax(rl)) << "greedy token " << step;
    EXPECT_LE(rel_diff(cl, rl), kRelTol) << "step " << step;
    const int32_t tok[1] = {test::argmax(rl)};
    rl = test::run_one(**ref, *rs, tok);
    cl = test::run_one(e, *cs, tok);
  }
}

// What kestreld builds: a budget below the dense weights is refused with their bytes.
TEST(PlacedCudaEngine, RefusesABudgetBelowTheDenseWeights) {
  if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
  auto m = Model::open(test::fixture_model_path("golden-qwen35moe"));
  ASSERT_TRUE(m.has_value());
  hybrid::PlacedEngineOptions o;
  o.cuda.max_slots = 2;
  o.cuda.n_ctx = kCtx;
  o.placement.gpu_memory = "64KiB";
  o.cpu_threads = 2;
  auto e = hybrid::make_placed_cuda_engine(**m, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(e.error().message.find("65536 bytes"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("GDN"), std::string::npos) << e.error().message;
}

// --n-cpu-moe over every MoE layer through the factory: all experts on the host, the reference's greedy tokens.
TEST(PlacedCudaEngine, NCpuMoeOverEveryLayerMatchesTheReference) {
  if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
  auto m = Model::open(test::fixture_model_path("golden-qwen35moe"));
  ASSERT_TRUE(m.has_value());
  hybrid::PlacedEngineOptions o;
  o.cuda.max_slots = 2;
  o.cuda.n_ctx = kCtx;
  o.placement.n_cpu_moe = static_cast<int32_t>((*m)->hparams().n_layer);
  o.cpu_threads = 2;
  o.activations = cpu::CpuActivations::kF32;
  auto placed = hybrid::make_placed_cuda_engine(**m, o);
  ASSERT_TRUE(placed.has_value()) << placed.error().to_string();
  // The default upload and side-read settings: the host's experts page-locked, the upload threshold and the side
  // read's share from the measured rates.
  int upload_from = 0;
  bool page_locked = false;
  float side_read = -1.0f;
  for (const std::string& line : placed->plan) {
    std::printf("%s\n", line.c_str());
    page_locked = page_locked || line.find("host experts page-locked (prompt uploads, side read)") != std::string::npos;
    if (line.find("side read: the GPU reads") != std::string::npos && line.find("(cost model: ") != std::string::npos) {
      std::sscanf(line.c_str(), " side read: the GPU reads %f%%", &side_read);
    }
    if (line.find("(cost model: ") != std::string::npos) {
      std::sscanf(line.c_str(), " prompt passes upload the host's experts from %d tokens", &upload_from);
    }
  }
  EXPECT_TRUE(page_locked);
  EXPECT_GE(upload_from, 1) << "no cost-model threshold in the plan";
  EXPECT_GT(side_read, 0.0f) << "no cost-model side read in the plan";
  EXPECT_LT(side_read, 100.0f);
  gpu::CudaEngine& e = *placed->engine;
  EXPECT_EQ(e.host_expert_layers(), e.hybrid_layers());
  EXPECT_EQ(e.routed_expert_bytes(), 0u);
  follows_the_reference(**m, e);
}

// A budget that splits the routed experts with nothing pinning them: the plan takes routing counts from a
// calibration prompt, keeps them in the given directory and reads them back on the next start; the GPU holds the
// most-chosen experts, and the engine on that plan gives the reference's greedy tokens.
TEST(PlacedCudaEngine, ASplitBudgetTakesTheHottestExpertsByCalibratedCounts) {
  if (!have_device()) GTEST_SKIP() << gpu::cuda_unavailable_reason();
  auto m = Model::open(test::fixture_model_path("golden-qwen35moe"));
  ASSERT_TRUE(m.has_value());
  const Model& model = **m;
  const ModelHparams& hp = model.hparams();
  uint64_t dense = 0, routed = 0;
  for (const PlannerTensor& t : planner_model(model.catalog()).tensors) {
    (t.placement == PlacementClass::kRoutedExperts ? routed : dense) += t.bytes;
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kestrel-routing-gpu-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  hybrid::PlacedEngineOptions o;
  o.cuda.max_slots = 2;
  o.cuda.n_ctx = kCtx;
  o.placement.gpu_memory = std::to_string(dense + routed / 2);
  o.cpu_threads = 2;
  o.activations = cpu::CpuActivations::kF32;
  o.routing_calibration = 64;
  o.routing_counts_dir = dir.string();
  auto plan_has = [](const hybrid::PlacedEngine& p, const std::string& text) {
    for (const std::string& line : p.plan) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  auto first = hybrid::make_placed_cuda_engine(model, o);
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  for (const std::string& line : first->plan) std::printf("%s\n", line.c_str());
  EXPECT_TRUE(plan_has(*first, "routing counts: a calibration prompt of 64 tokens")) << "no calibration line";
  EXPECT_TRUE(plan_has(*first, "(kept in " + dir.string())) << "counts not kept";
  const uint64_t key = routing_key(model);
  auto counts = load_routing_counts(routing_counts_path(dir.string(), key), key, hp.n_layer, hp.n_expert);
  ASSERT_TRUE(counts.has_value()) << counts.error().to_string();
  EXPECT_EQ(counts->tokens, 64);
  // Every expert on the GPU was chosen at least as often as every expert left on the host.
  uint64_t gpu_min = UINT64_MAX, host_max = 0;
  size_t on_gpu = 0, on_host = 0;
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    const std::vector<uint8_t>& row = first->decision.expert_on_gpu[l];
    for (uint32_t e = 0; e < row.size(); ++e) {
      const uint64_t c = counts->counts[static_cast<size_t>(l) * hp.n_expert + e];
      if (row[e] != 0) {
        gpu_min = std::min(gpu_min, c);
        ++on_gpu;
      } else {
        host_max = std::max(host_max, c);
        ++on_host;
      }
    }
  }
  ASSERT_GT(on_gpu, 0u);
  ASSERT_GT(on_host, 0u);
  EXPECT_GE(gpu_min, host_max);
  first->engine.reset();

  auto second = hybrid::make_placed_cuda_engine(model, o);
  ASSERT_TRUE(second.has_value()) << second.error().to_string();
  EXPECT_TRUE(plan_has(*second, "routing counts: kept from an earlier run, 64 tokens")) << "the kept counts not read";
  EXPECT_EQ(second->decision.expert_on_gpu, first->decision.expert_on_gpu);
  gpu::CudaEngine& e = *second->engine;
  follows_the_reference(model, e);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kestrel
