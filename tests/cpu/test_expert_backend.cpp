// The CPU ExpertBackend (cpu/expert_backend.h) against the reference's MoE (core/reference/moe.h), on every MoE layer
// of the golden fixtures and the tiny presets (experts Q4_0 with Q8_0 down, and all Q4_0) and on layers of K-quant
// experts built in memory (Q4_K with Q6_K down, Q5_K with Q4_K down), with random input rows and random routings, at
// every instruction-set level this machine has:
//   - the test's oracle, routed_reference (ref::swiglu_forward per chosen expert, summed from 0 in ascending expert
//     id), equals ref::moe_forward without its shared expert bit for bit under the router's own routing: it is the
//     routed part of the reference's MoE;
//   - f32 activations agree with it within kF32Tol, bit for bit at the scalar level; int8 activations within kInt8Tol;
//   - the bits do not depend on the thread count (1, 2, all), on the batch (a token alone or among 8 others), on the
//     order of a token's choices, or on the thread that calls run();
//   - a backend holding a subset of the experts and one holding its complement sum to the whole, within the rounding
//     of that sum (kSplitUlps below), and each is bit for bit its choices' terms added in ascending id;
//   - every refused batch (bad layer, size, id, duplicate, expert not held, overlap) leaves the output untouched.
//
// Tolerances, max|Δ| ≤ tol · max(1, max|ref|) per row (the CPU tests' measure):
// - kF32Tol 4e-6: an expert is three GEMVs in sequence (gate, up → SwiGLU → down) whose SIMD kernels sum in another
//   order than the reference (~1e-7 relative per product); measured ≤ 5.7e-7 on these layers at avx2 and avx512.
//   A wrong expert, weight, order of rows or SwiGLU half is O(1) of the row's scale.
// - kInt8Tol 4e-2: each GEMV's input rounded per 32-element block to 1/254 of its largest value (act_q8.h), as for
//   the CPU engine's FFN in test_cpu_blocks (there measured ≤ 1.7e-2, here ≤ 1e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/expert_backend.h"
#include "core/model/model.h"
#include "core/quant/quant.h"
#include "core/reference/ffn.h"
#include "core/reference/model_weights.h"
#include "core/reference/moe.h"
#include "cpu/expert_backend.h"
#include "cpu/gemv.h"
#include "cpu/isa.h"
#include "tests/core/engine/tiny_models.h"

namespace kestrel::cpu {
namespace {

constexpr float kF32Tol = 4e-6f;
constexpr float kInt8Tol = 4e-2f;
constexpr int kTokens = 8;

// max over rows of max|a − b| / max(1, max|b|), rows of width w.
float row_rel_diff(const std::vector<float>& a, const std::vector<float>& b, size_t w) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (size_t r = 0; r * w < b.size() && r * w < a.size(); ++r) {
    float d = 0.0f, m = 1.0f;
    for (size_t i = r * w; i < (r + 1) * w; ++i) {
      d = std::max(d, std::fabs(a[i] - b[i]));
      m = std::max(m, std::fabs(b[i]));
    }
    worst = std::max(worst, d / m);
  }
  return worst;
}

std::vector<Isa> levels() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// Whether a backend of this level and form multiplies int8 activations (avx512 only; the others fall back to f32).
bool runs_int8(Isa isa, CpuActivations act) {
  return act == CpuActivations::kInt8 && gemv_kernel(isa, GgmlType::kQ4_0, GemvInput::kQ8).input == GemvInput::kQ8;
}

// Input rows and choices of one batch; its ExpertBatch points into them.
struct Rows {
  int32_t n = 0, k = 0, H = 0;
  std::vector<float> x;               // f32 [n, H]
  std::vector<ExpertChoice> choices;  // [n, k]

  ExpertBatch batch(int32_t layer, std::vector<float>& y) const {
    y.resize(static_cast<size_t>(n) * static_cast<size_t>(H));
    return ExpertBatch{layer, n, H, k, x.data(), choices.data(), y.data()};
  }
  // Token t's row and choices as a batch of its own.
  Rows token(int32_t t) const {
    Rows r{1, k, H, {}, {}};
    r.x.assign(x.begin() + t * H, x.begin() + (t + 1) * H);
    r.choices.assign(choices.begin() + t * k, choices.begin() + (t + 1) * k);
    return r;
  }
};

// n tokens of N(0, 1) rows, each with k distinct experts of E and positive weights summing to 1 (as moe_route's).
Rows random_rows(std::mt19937& rng, int32_t n, int32_t k, int32_t E, int32_t H) {
  Rows r{n, k, H, std::vector<float>(static_cast<size_t>(n) * H),
         std::vector<ExpertChoice>(static_cast<size_t>(n) * k)};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  for (float& v : r.x) v = normal(rng);
  std::vector<int32_t> ids(static_cast<size_t>(E));
  for (int32_t t = 0; t < n; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    float sum = 0.0f;
    ExpertChoice* c = r.choices.data() + t * k;
    for (int32_t j = 0; j < k; ++j) {
      c[j] = ExpertChoice{ids[static_cast<size_t>(j)], uniform(rng)};
      sum += c[j].weight;
    }
    for (int32_t j = 0; j < k; ++j) c[j].weight /= sum;
  }
  return r;
}

// The oracle: per token, 0 plus ref::swiglu_forward of each chosen expert times its weight, in ascending expert id
// (choices marked kExpertNotHere skipped) — ref::moe_forward's routed part, operation for operation.
std::vector<float> routed_reference(const ref::MoeWeights& w, const Rows& r) {
  const size_t H = static_cast<size_t>(r.H);
  std::vector<float> y(static_cast<size_t>(r.n) * H, 0.0f), ye(H);
  for (int32_t t = 0; t < r.n; ++t) {
    std::vector<ExpertChoice> own;
    for (int32_t j = 0; j < r.k; ++j) {
      if (r.choices[static_cast<size_t>(t * r.k + j)].expert != kExpertNotHere) {
        own.push_back(r.choices[static_cast<size_t>(t * r.k + j)]);
      }
    }
    std::sort(own.begin(), own.end(), [](const ExpertChoice& a, const ExpertChoice& b) { return a.expert < b.expert; });
    for (const ExpertChoice& c : own) {
      const auto e = static_cast<uint64_t>(c.expert);
      auto gate = ref::expert_matrix(w.gate_exps, e), up = ref::expert_matrix(w.up_exps, e);
      auto down = ref::expert_matrix(w.down_exps, e);
      EXPECT_TRUE(gate && up && down);
      EXPECT_TRUE(ref::swiglu_forward(*gate, *up, *down, r.x.data() + t * r.H, 1, ye.data()));
      float* yt = y.data() + t * r.H;
      for (size_t i = 0; i < H; ++i) yt[i] += ye[i] * c.weight;
    }
  }
  return y;
}

// The output of run() on rows of layer l.
std::vector<float> run(ExpertBackend& be, int32_t layer, const Rows& r) {
  std::vector<float> y;
  const Status s = be.run(r.batch(layer, y));
  EXPECT_TRUE(s) << s.error().to_string();
  return y;
}

class ExpertBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string path = test::model_path(GetParam());
    ASSERT_FALSE(path.empty());
    auto m = Model::open(path);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    model_ = std::move(*m);
    auto w = ref::RefModelWeights::from_catalog(model_->catalog());
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    weights_ = std::move(*w);
    const ModelHparams& hp = model_->hparams();
    ASSERT_TRUE(hp.is_moe());
    H_ = static_cast<int32_t>(hp.n_embd);
    E_ = static_cast<int32_t>(hp.n_expert);
    k_ = static_cast<int32_t>(hp.n_expert_used);
    for (uint32_t l = 0; l < hp.n_layer; ++l) {
      if (weights_.layers[l].is_moe) moe_layers_.push_back(static_cast<int32_t>(l));
    }
    ASSERT_FALSE(moe_layers_.empty());
  }

  std::unique_ptr<CpuExpertBackend> make(const ExpertSet& set, int threads, CpuActivations act,
                                         std::optional<Isa> isa = std::nullopt) {
    CpuExpertBackendOptions o;
    o.threads = threads;
    o.pin = false;  // ctest runs two test processes at once on this machine's cores
    o.activations = act;
    o.isa = isa;
    auto b = make_cpu_expert_backend(*model_, set, o);
    EXPECT_TRUE(b.has_value()) << (b ? "" : b.error().to_string());
    return b ? std::move(*b) : nullptr;
  }

  ExpertSet all() const { return ExpertSet::all(model_->hparams()); }

  std::unique_ptr<Model> model_;
  ref::RefModelWeights weights_;
  int32_t H_ = 0, E_ = 0, k_ = 0;
  std::vector<int32_t> moe_layers_;
};

TEST_P(ExpertBackendTest, OracleIsTheRoutedPartOfTheReference) {
  std::mt19937 rng(1);
  for (int32_t l : moe_layers_) {
    ref::MoeWeights routed = weights_.layers[static_cast<size_t>(l)].moe;
    routed.gate_shexp = ref::QuantMatrix{};  // no shared expert: ref::moe_forward is then its routed part alone
    Rows r = random_rows(rng, kTokens, k_, E_, H_);
    std::vector<float> expected(r.x.size());
    std::vector<int32_t> ids(static_cast<size_t>(kTokens * k_));
    ASSERT_TRUE(ref::moe_forward(routed, r.x.data(), kTokens, expected.data(), ids.data()));
    // The router's own choices and weights (moe_route on its logits), in moe_route's order.
    std::vector<float> logits(static_cast<size_t>(E_));
    for (int32_t t = 0; t < kTokens; ++t) {
      ASSERT_TRUE(ref::matvec(routed.router, r.x.data() + t * H_, logits.data()));
      std::vector<int32_t> id(static_cast<size_t>(k_));
      std::vector<float> wt(static_cast<size_t>(k_));
      ref::moe_route(logits.data(), E_, k_, id.data(), wt.data());
      for (int32_t j = 0; j < k_; ++j) {
        ASSERT_EQ(id[static_cast<size_t>(j)], ids[static_cast<size_t>(t * k_ + j)]);
        r.choices[static_cast<size_t>(t * k_ + j)] =
            ExpertChoice{id[static_cast<size_t>(j)], wt[static_cast<size_t>(j)]};
      }
    }
    EXPECT_EQ(routed_reference(routed, r), expected) << "layer " << l;
  }
}

TEST_P(ExpertBackendTest, AgreesWithTheReference) {
  for (Isa isa : levels()) {
    for (CpuActivations act : {CpuActivations::kF32, CpuActivations::kInt8}) {
      std::unique_ptr<CpuExpertBackend> be = make(all(), 0, act, isa);
      ASSERT_TRUE(be);
      const bool int8 = runs_int8(isa, act);
      std::mt19937 rng(2);
      float worst = 0.0f;
      for (int32_t l : moe_layers_) {
        const Rows r = random_rows(rng, kTokens, k_, E_, H_);
        const std::vector<float> y = run(*be, l, r);
        const std::vector<float> expected = routed_reference(weights_.layers[static_cast<size_t>(l)].moe, r);
        worst = std::max(worst, row_rel_diff(y, expected, static_cast<size_t>(H_)));
        if (isa == Isa::kScalar && !int8) {
          EXPECT_EQ(y, expected) << "layer " << l << ": the scalar level is the reference's arithmetic";
        }
      }
      const float tol = int8 ? kInt8Tol : kF32Tol;
      EXPECT_LE(worst, tol) << be->summary();
      const ref::MoeWeights& w0 = weights_.layers[static_cast<size_t>(moe_layers_.front())].moe;
      std::printf(
          "[ %s ] %s, experts %s/%s/%s: worst row rel diff %.3g against the reference's routed experts "
          "(tolerance %.1g)\n",
          GetParam().c_str(), be->summary().c_str(), std::string(ggml_type_name(w0.gate_exps.type)).c_str(),
          std::string(ggml_type_name(w0.up_exps.type)).c_str(), std::string(ggml_type_name(w0.down_exps.type)).c_str(),
          worst, tol);
    }
  }
}

TEST_P(ExpertBackendTest, BitsIndependentOfThreadsBatchAndCallingThread) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (Isa isa : levels()) {
    for (CpuActivations act : {CpuActivations::kInt8, CpuActivations::kF32}) {
      std::unique_ptr<CpuExpertBackend> one = make(all(), 1, act, isa);
      ASSERT_TRUE(one);
      std::vector<std::unique_ptr<CpuExpertBackend>> others;
      for (int threads : {2, hw}) others.push_back(make(all(), threads, act, isa));
      std::mt19937 rng(3);
      for (int32_t l : moe_layers_) {
        const Rows r = random_rows(rng, kTokens, k_, E_, H_);
        const std::vector<float> y = run(*one, l, r);
        const std::string what = one->summary() + ", layer " + std::to_string(l);
        for (const auto& o : others) {
          ASSERT_TRUE(o);
          EXPECT_EQ(run(*o, l, r), y) << what << " vs " << o->summary();
        }
        // A token alone, at the batch's first and a middle row.
        for (int32_t t : {0, 3}) {
          const std::vector<float> alone = run(*one, l, r.token(t));
          EXPECT_TRUE(std::equal(alone.begin(), alone.end(), y.begin() + t * H_))
              << what << ": token " << t << " alone";
        }
        // Each token's choices in reverse order.
        Rows reversed = r;
        for (int32_t t = 0; t < kTokens; ++t) {
          std::reverse(reversed.choices.begin() + t * k_, reversed.choices.begin() + (t + 1) * k_);
        }
        EXPECT_EQ(run(*one, l, reversed), y) << what << ": choices in another order";
        // run() on another thread than the one that made the backend, then on this one again.
        ExpertBackend& be = *others.back();
        std::vector<float> ya;
        Status sa = make_error(ErrorCode::kInternal, "not run");
        std::thread([&] { sa = be.run(r.batch(l, ya)); }).join();
        ASSERT_TRUE(sa) << sa.error().to_string();
        EXPECT_EQ(ya, y) << what << ": run() on another thread";
        EXPECT_EQ(run(be, l, r), y) << what << ": run() on this thread after another's";
      }
    }
  }
}

TEST_P(ExpertBackendTest, SplitSumsToTheWhole) {
  std::mt19937 rng(4);
  std::bernoulli_distribution half(0.5);
  constexpr float kU = 5.9604645e-8f;  // 2^-24, f32's unit roundoff
  for (CpuActivations act : {CpuActivations::kF32, CpuActivations::kInt8}) {
    std::unique_ptr<CpuExpertBackend> whole = make(all(), 0, act);
    ASSERT_TRUE(whole);
    for (int32_t l : moe_layers_) {
      // A holds a random half of layer l's experts, B the rest; neither holds another layer's.
      ExpertSet a, b;
      a.held.assign(model_->hparams().n_layer, {});
      b.held = a.held;
      std::vector<uint8_t> in_a(static_cast<size_t>(E_));
      for (uint8_t& h : in_a) h = half(rng) ? 1 : 0;
      a.held[static_cast<size_t>(l)] = in_a;
      b.held[static_cast<size_t>(l)].resize(in_a.size());
      for (size_t e = 0; e < in_a.size(); ++e) b.held[static_cast<size_t>(l)][e] = in_a[e] != 0 ? 0 : 1;
      std::unique_ptr<CpuExpertBackend> ba = make(a, 0, act), bb = make(b, 0, act);
      ASSERT_TRUE(ba && bb);

      const Rows r = random_rows(rng, kTokens, k_, E_, H_);
      // The rows with only the choices `keep` accepts, the others marked for another device.
      auto only = [&](auto keep) {
        Rows s = r;
        for (int32_t i = 0; i < kTokens * k_; ++i) {
          if (!keep(i)) s.choices[static_cast<size_t>(i)].expert = kExpertNotHere;
        }
        return s;
      };
      auto held_by_a = [&](int32_t i) {
        return in_a[static_cast<size_t>(r.choices[static_cast<size_t>(i)].expert)] != 0;
      };
      const std::vector<float> y = run(*whole, l, r);
      const std::vector<float> ya = run(*ba, l, only(held_by_a));
      const std::vector<float> yb = run(*bb, l, only([&](int32_t i) { return !held_by_a(i); }));
      // terms[j]: every token's choice j alone (weight · expert output, exactly).
      std::vector<std::vector<float>> terms;
      for (int32_t j = 0; j < k_; ++j) terms.push_back(run(*whole, l, only([&](int32_t i) { return i % k_ == j; })));

      const std::string what = whole->summary() + ", layer " + std::to_string(l);
      for (int32_t t = 0; t < kTokens; ++t) {
        std::vector<int32_t> order(static_cast<size_t>(k_));  // token t's choices by ascending expert id
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int32_t p, int32_t q) {
          return r.choices[static_cast<size_t>(t * k_ + p)].expert < r.choices[static_cast<size_t>(t * k_ + q)].expert;
        });
        for (int32_t i = 0; i < H_; ++i) {
          const size_t at = static_cast<size_t>(t * H_ + i);
          float sum = 0.0f, sum_a = 0.0f, sum_b = 0.0f, mag = 0.0f;
          for (int32_t j : order) {
            const float term = terms[static_cast<size_t>(j)][at];
            sum += term;
            (held_by_a(t * k_ + j) ? sum_a : sum_b) += term;
            mag += std::fabs(term);
          }
          ASSERT_EQ(y[at], sum) << what << ": token " << t << " element " << i << " is not its terms in ascending id";
          ASSERT_EQ(ya[at], sum_a) << what << ": token " << t << " element " << i << " (subset)";
          ASSERT_EQ(yb[at], sum_b) << what << ": token " << t << " element " << i << " (complement)";
          // Both sums round at most k − 1 additions each, plus the join: 2k units of roundoff of Σ|terms|.
          ASSERT_LE(std::fabs((ya[at] + yb[at]) - y[at]), 2.0f * static_cast<float>(k_) * kU * mag)
              << what << ": token " << t << " element " << i;
        }
      }
    }
  }
}

TEST_P(ExpertBackendTest, RefusalsWriteNothing) {
  // Layer l0 holds its even experts only, the second MoE layer none, the others all.
  const int32_t l0 = moe_layers_.front();
  ExpertSet set = all();
  for (size_t e = 1; e < set.held[static_cast<size_t>(l0)].size(); e += 2) set.held[static_cast<size_t>(l0)][e] = 0;
  const int32_t none = moe_layers_.size() > 1 ? moe_layers_[1] : -1;
  if (none >= 0) set.held[static_cast<size_t>(none)].clear();
  std::unique_ptr<CpuExpertBackend> be = make(set, 0, CpuActivations::kInt8);
  ASSERT_TRUE(be);
  std::mt19937 rng(5);
  Rows good = random_rows(rng, kTokens, k_, E_, H_);
  for (ExpertChoice& c : good.choices) {
    if (c.expert % 2 == 1) c.expert = kExpertNotHere;
  }
  constexpr float kSentinel = 12345.0f;
  const std::vector<float> untouched(good.x.size(), kSentinel);
  const int32_t last = (kTokens - 1) * k_;  // the last token's first choice: earlier tokens are valid
  struct Case {
    const char* what;
    ErrorCode code;
    std::function<void(Rows&, ExpertBatch&)> spoil;
  };
  const int32_t odd = 1;  // an expert layer l0 does not hold
  const std::vector<Case> cases = {
      {"negative layer", ErrorCode::kOutOfRange, [](Rows&, ExpertBatch& b) { b.layer = -1; }},
      {"layer past the model", ErrorCode::kOutOfRange,
       [&](Rows&, ExpertBatch& b) { b.layer = static_cast<int32_t>(model_->hparams().n_layer); }},
      {"hidden size", ErrorCode::kInvalidArgument, [](Rows&, ExpertBatch& b) { b.hidden += 1; }},
      {"negative token count", ErrorCode::kInvalidArgument, [](Rows&, ExpertBatch& b) { b.n_tokens = -1; }},
      {"k = 0", ErrorCode::kInvalidArgument, [](Rows&, ExpertBatch& b) { b.k = 0; }},
      {"k > n_expert", ErrorCode::kInvalidArgument, [&](Rows&, ExpertBatch& b) { b.k = E_ + 1; }},
      {"null input", ErrorCode::kInvalidArgument, [](Rows&, ExpertBatch& b) { b.x = nullptr; }},
      {"null choices", ErrorCode::kInvalidArgument, [](Rows&, ExpertBatch& b) { b.choices = nullptr; }},
      {"id n_expert", ErrorCode::kOutOfRange, [&](Rows& r, ExpertBatch&) { r.choices[last].expert = E_; }},
      {"id -2", ErrorCode::kOutOfRange, [&](Rows& r, ExpertBatch&) { r.choices[last].expert = -2; }},
      {"an expert twice", ErrorCode::kInvalidArgument,
       [&](Rows& r, ExpertBatch&) {
         r.choices[last].expert = 0;
         r.choices[last + 1].expert = 0;
       }},
      {"an expert not held", ErrorCode::kNotFound,
       [&](Rows& r, ExpertBatch&) {
         for (int32_t j = 0; j < k_; ++j) r.choices[last + j].expert = kExpertNotHere;
         r.choices[last].expert = odd;
       }},
  };
  for (const Case& c : cases) {
    Rows r = good;
    std::vector<float> y;
    ExpertBatch b = r.batch(l0, y);
    std::fill(y.begin(), y.end(), kSentinel);
    c.spoil(r, b);
    const Status checked = be->check(b);
    ASSERT_FALSE(checked) << c.what;
    EXPECT_EQ(checked.error().code, c.code) << c.what << ": " << checked.error().to_string();
    const Status ran = be->run(b);
    ASSERT_FALSE(ran) << c.what;
    EXPECT_EQ(ran.error().code, c.code) << c.what;
    EXPECT_EQ(y, untouched) << c.what << ": the output was written";
  }

  // The output overlapping the input: refused, the input (the output's rows) unchanged.
  {
    Rows r = good;
    const std::vector<float> x0 = r.x;
    ExpertBatch b{l0, kTokens, H_, k_, r.x.data(), r.choices.data(), r.x.data() + H_};
    EXPECT_EQ(be->run(b).error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.x, x0);
  }

  // Zero tokens: nothing to do. A layer this backend holds nothing of: choices all for another device give zero
  // rows, any other is refused.
  {
    std::vector<float> y;
    ExpertBatch b = good.batch(l0, y);
    b.n_tokens = 0;
    EXPECT_TRUE(be->run(b));
  }
  if (none >= 0) {
    Rows r = good;
    for (ExpertChoice& c : r.choices) c.expert = kExpertNotHere;
    std::vector<float> y;
    ExpertBatch b = r.batch(none, y);
    std::fill(y.begin(), y.end(), kSentinel);
    ASSERT_TRUE(be->run(b));
    EXPECT_EQ(y, std::vector<float>(y.size(), 0.0f));
    r.choices[0].expert = 0;
    std::fill(y.begin(), y.end(), kSentinel);
    EXPECT_EQ(be->run(b).error().code, ErrorCode::kNotFound);
    EXPECT_EQ(y, untouched);
  }
}

TEST_P(ExpertBackendTest, RefusesBadSetsAndOptions) {
  CpuExpertBackendOptions o;
  o.pin = false;
  ExpertSet set = all();
  set.held.pop_back();
  EXPECT_EQ(make_cpu_expert_backend(*model_, set, o).error().code, ErrorCode::kInvalidArgument) << "a layer short";
  set = all();
  set.held[static_cast<size_t>(moe_layers_.front())].push_back(1);
  EXPECT_EQ(make_cpu_expert_backend(*model_, set, o).error().code, ErrorCode::kInvalidArgument) << "a row too long";
  o.threads = -1;
  EXPECT_EQ(make_cpu_expert_backend(*model_, all(), o).error().code, ErrorCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Models, ExpertBackendTest,
                         ::testing::Values("golden-qwen35moe", "golden-qwen3next", "tiny", "tiny-qwen3next",
                                           "tiny-q4_0"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// The K-quant mixes real files have (the tiny models' rows are too short for 256-element super-blocks): one layer of
// 6 experts with H = I = 256 built in memory from random weights, gate/up Q4_K with down Q6_K (Q4_K_M's expert
// types), and Q5_K with Q4_K; layer 0 has no experts. Through make_cpu_expert_backend's views overload, against the
// same oracle and tolerances at every level.
TEST(ExpertBackendKQuants, AgreesWithTheReference) {
  constexpr int32_t H = 256, I = 256, E = 6, k = 3;
  struct Mix {
    GgmlType gate_up, down;
  };
  for (const Mix mix : {Mix{GgmlType::kQ4_K, GgmlType::kQ6_K}, Mix{GgmlType::kQ5_K, GgmlType::kQ4_K}}) {
    std::mt19937 rng(6);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    // A stack of E matrices of n_out rows of n_in random weights, quantized to `type`.
    auto stack = [&](GgmlType type, int32_t n_in, int32_t n_out) {
      const uint64_t row_bytes = *ggml_row_bytes(type, static_cast<uint64_t>(n_in));
      std::vector<uint8_t> bytes(row_bytes * static_cast<uint64_t>(n_out * E));
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int32_t r = 0; r < n_out * E; ++r) {
        for (float& v : row) v = normal(rng);
        EXPECT_TRUE(quantize_row(type, row.data(), bytes.data() + static_cast<uint64_t>(r) * row_bytes, n_in));
      }
      return bytes;
    };
    const std::vector<uint8_t> gate = stack(mix.gate_up, H, I), up = stack(mix.gate_up, H, I);
    const std::vector<uint8_t> down = stack(mix.down, I, H);
    ref::MoeWeights w;
    w.n_expert_used = k;
    w.gate_exps = ref::QuantExperts{mix.gate_up, gate.data(), H, I, E};
    w.up_exps = ref::QuantExperts{mix.gate_up, up.data(), H, I, E};
    w.down_exps = ref::QuantExperts{mix.down, down.data(), I, H, E};
    ExpertSet set;
    set.held = {{}, std::vector<uint8_t>(E, 1)};
    for (Isa isa : levels()) {
      for (CpuActivations act : {CpuActivations::kF32, CpuActivations::kInt8}) {
        CpuExpertBackendOptions o;
        o.pin = false;
        o.activations = act;
        o.isa = isa;
        auto be = make_cpu_expert_backend({ref::MoeWeights{}, w}, set, o);
        ASSERT_TRUE(be.has_value()) << be.error().to_string();
        const Rows r = random_rows(rng, kTokens, k, E, H);
        const std::vector<float> y = run(**be, 1, r);
        const std::vector<float> expected = routed_reference(w, r);
        const float d = row_rel_diff(y, expected, H);
        const bool int8 = runs_int8(isa, act);
        EXPECT_LE(d, int8 ? kInt8Tol : kF32Tol) << (*be)->summary();
        if (isa == Isa::kScalar && !int8) {
          EXPECT_EQ(y, expected);
        }
        std::printf("[ %s/%s ] %s: rel diff %.3g\n", std::string(ggml_type_name(mix.gate_up)).c_str(),
                    std::string(ggml_type_name(mix.down)).c_str(), (*be)->summary().c_str(), d);
      }
    }
  }
}

TEST(ExpertSet, FromPlacementAndAll) {
  PlacementDecision d;
  d.expert_on_gpu = {{1, 0, 1}, {}, {0, 0, 0}, {1, 1, 1}};
  const ExpertSet host = ExpertSet::on_device(d, WeightDevice::kHost);
  const ExpertSet gpu = ExpertSet::on_device(d, WeightDevice::kGpu);
  EXPECT_EQ(host.held, (std::vector<std::vector<uint8_t>>{{0, 1, 0}, {}, {1, 1, 1}, {}}));
  EXPECT_EQ(gpu.held, (std::vector<std::vector<uint8_t>>{{1, 0, 1}, {}, {}, {1, 1, 1}}));
  EXPECT_EQ(host.count(), 4u);
  EXPECT_EQ(gpu.count(), 5u);
  EXPECT_TRUE(host.holds(0, 1));
  EXPECT_FALSE(host.holds(0, 0));
  EXPECT_FALSE(host.holds(1, 0));
  EXPECT_FALSE(host.holds(0, 3));
  EXPECT_FALSE(host.holds(-1, 0));
  EXPECT_FALSE(host.holds(4, 0));
  ModelHparams hp;
  hp.n_layer = 3;
  hp.n_expert = 4;
  EXPECT_EQ(ExpertSet::all(hp).count(), 12u);
  hp.n_expert = 0;
  EXPECT_EQ(ExpertSet::all(hp).held, (std::vector<std::vector<uint8_t>>(3)));
}

}  // namespace
}  // namespace kestrel::cpu
