// Model-level reference forward pass on kestrel-mkmodel's tiny presets (one per architecture): prefill ≡ decode,
// clone ≡ continue, snapshot/restore, determinism, activations stay finite over hundreds of tokens, routing spread,
// and bad input leaves the session untouched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/reference/forward.h"
#include "ref_test_util.h"

namespace kestrel::ref {
namespace {

namespace fs = std::filesystem;

// Writes (once per process) and opens a tiny preset with the real mkmodel binary.
const Model& tiny_model(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto it = models.find(preset);
  if (it != models.end()) return *it->second;
  const fs::path dir = fs::temp_directory_path() / ("kestrel_test_forward_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / (preset + ".gguf");
  const std::string cmd =
      std::string(KESTREL_MKMODEL_BIN) + " --preset " + preset + " -o " + path.string() + " 2>/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto m = Model::open(path.string());
  EXPECT_TRUE(m) << (m ? "" : m.error().to_string());
  fs::remove_all(dir);  // the mapping stays valid after unlink
  return *(models[preset] = std::move(*m));
}

struct Fixture {
  const Model& model;
  RefModelWeights w;
};

Fixture load(const std::string& preset) {
  const Model& m = tiny_model(preset);
  auto w = RefModelWeights::from_catalog(m.catalog());
  EXPECT_TRUE(w) << (w ? "" : w.error().to_string());
  return Fixture{m, std::move(*w)};
}

std::vector<int32_t> random_tokens(int n, uint32_t seed, int n_vocab) {
  std::vector<int32_t> t(n);
  uint64_t s = seed;
  for (int32_t& x : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(n_vocab));
  }
  return t;
}

SessionState new_session(const RefModelWeights& w, int n_ctx = 512) {
  auto s = SessionState::create(w.hp, n_ctx);
  EXPECT_TRUE(s);
  return std::move(*s);
}

class ForwardByArch : public ::testing::TestWithParam<std::string> {};

// The chunked prefill of 80 tokens (crossing a 64-token chunk) equals 80 recurrent decode steps.
TEST_P(ForwardByArch, PrefillMatchesTokenByTokenDecode) {
  Fixture f = load(GetParam());
  const int n = 80;
  const auto toks = random_tokens(n, 7, 150000);
  SessionState a = new_session(f.w), b = new_session(f.w);
  ForwardOutput pre;
  ForwardOptions opt;
  opt.all_logits = true;
  ASSERT_TRUE(forward(f.w, a, toks, opt, &pre));
  const size_t V = f.w.hp.n_vocab;
  ForwardOptions dec_opt;
  dec_opt.gdn_mode = GdnMode::kRecurrent;
  for (int t = 0; t < n; ++t) {
    ForwardOutput o;
    ASSERT_TRUE(forward(f.w, b, std::span(toks).subspan(t, 1), dec_opt, &o));
    EXPECT_LT(test::max_rel_diff(o.logits.data(), pre.logits.data() + t * V, V), 1e-4) << "token " << t;
  }
  for (uint32_t l = 0; l < f.w.hp.n_layer; ++l) {
    if (f.w.hp.layer_kinds[l] != LayerKind::kGatedDeltaNet) continue;
    EXPECT_LT(test::max_rel_diff(b.gdn(l).s.data(), a.gdn(l).s.data(), a.gdn(l).s.size()), 1e-4) << "layer " << l;
    // Layer 0's conv history is bit-equal; deeper layers see the previous layers' f32 rounding differences.
    EXPECT_LT(test::max_rel_diff(b.gdn(l).conv.data(), a.gdn(l).conv.data(), a.gdn(l).conv.size()), 1e-4) << l;
  }
}

TEST_P(ForwardByArch, CloneThenContinueEqualsContinue) {
  Fixture f = load(GetParam());
  const auto toks = random_tokens(40, 11, 150000);
  SessionState s = new_session(f.w);
  ForwardOutput o;
  ASSERT_TRUE(forward(f.w, s, std::span(toks).first(30), {}, &o));
  SessionState fork = s;  // clone
  ForwardOutput a, b;
  ASSERT_TRUE(forward(f.w, s, std::span(toks).subspan(30), {}, &a));
  ASSERT_TRUE(forward(f.w, fork, std::span(toks).subspan(30), {}, &b));
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_TRUE(s == fork);
}

// copy_from forks a sequence into a state of another capacity: the continuation is bit-identical, and a
// destination too small for the source is refused without being touched.
TEST_P(ForwardByArch, CopyFromAnotherCapacityContinuesIdentically) {
  Fixture f = load(GetParam());
  const auto toks = random_tokens(40, 13, 150000);
  SessionState s = new_session(f.w);
  ForwardOutput o;
  ASSERT_TRUE(forward(f.w, s, std::span(toks).first(30), {}, &o));
  SessionState bigger = new_session(f.w, 1024);
  ASSERT_TRUE(bigger.copy_from(s));
  EXPECT_EQ(bigger.n_past(), 30);
  EXPECT_EQ(bigger.n_ctx(), 1024);
  ForwardOutput a, b;
  ASSERT_TRUE(forward(f.w, s, std::span(toks).subspan(30), {}, &a));
  ASSERT_TRUE(forward(f.w, bigger, std::span(toks).subspan(30), {}, &b));
  EXPECT_EQ(a.logits, b.logits);

  SessionState small = new_session(f.w, 16);
  const SessionState before = small;
  EXPECT_EQ(small.copy_from(s).error().code, ErrorCode::kOutOfRange);
  EXPECT_TRUE(small == before);
}

TEST_P(ForwardByArch, SnapshotRestoreRoundTrip) {
  Fixture f = load(GetParam());
  const auto toks = random_tokens(20, 5, 150000);
  SessionState s = new_session(f.w);
  ForwardOutput o;
  ASSERT_TRUE(forward(f.w, s, toks, {}, &o));
  const std::vector<uint8_t> snap = s.snapshot();
  SessionState r = new_session(f.w);
  ASSERT_TRUE(r.restore(snap));
  EXPECT_TRUE(r == s);
  ForwardOutput a, b;
  const std::vector<int32_t> next = {42};
  ASSERT_TRUE(forward(f.w, s, next, {}, &a));
  ASSERT_TRUE(forward(f.w, r, next, {}, &b));
  EXPECT_EQ(a.logits, b.logits);

  // Corrupt snapshots are refused and leave the target untouched.
  SessionState c = new_session(f.w);
  const SessionState before = c;
  std::vector<uint8_t> bad = snap;
  bad[0] ^= 0xFF;
  EXPECT_EQ(c.restore(bad).error().code, ErrorCode::kDataLoss);
  EXPECT_EQ(c.restore(std::span(snap).first(snap.size() - 1)).error().code, ErrorCode::kDataLoss);
  std::vector<uint8_t> longer = snap;
  longer.push_back(0);
  EXPECT_EQ(c.restore(longer).error().code, ErrorCode::kDataLoss);
  SessionState other_ctx = new_session(f.w, 256);
  EXPECT_EQ(other_ctx.restore(snap).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(c == before);
}

TEST_P(ForwardByArch, TwoRunsBitIdentical) {
  Fixture f = load(GetParam());
  const auto toks = random_tokens(70, 3, 150000);
  ForwardOptions opt;
  opt.capture_hidden = true;
  ForwardOutput a, b;
  SessionState s1 = new_session(f.w), s2 = new_session(f.w);
  ASSERT_TRUE(forward(f.w, s1, toks, opt, &a));
  ASSERT_TRUE(forward(f.w, s2, toks, opt, &b));
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.hidden.data(), b.hidden.data(), a.hidden.size() * sizeof(float)));
  EXPECT_TRUE(s1 == s2);
}

// "Weights scaled so activations stay finite over hundreds of tokens": a 280-token prefill then 20 decode steps;
// the residual stream after the last layer keeps a bounded RMS at every position and every logit is finite.
TEST_P(ForwardByArch, ActivationsStayFiniteOverHundredsOfTokens) {
  Fixture f = load(GetParam());
  SessionState s = new_session(f.w, 512);
  const int n_prefill = 280, n_total = 300;
  const auto toks = random_tokens(n_total, 13, 150000);
  ForwardOptions opt;
  opt.capture_hidden = true;
  const size_t H = f.w.hp.n_embd;
  auto check_rms = [&](const float* row, int t) {
    double ss = 0;
    for (size_t i = 0; i < H; ++i) ss += static_cast<double>(row[i]) * row[i];
    const double rms = std::sqrt(ss / static_cast<double>(H));
    EXPECT_LT(rms, 100.0) << "residual stream grows: token " << t;
    EXPECT_GT(rms, 1e-3) << "residual stream vanishes: token " << t;
  };
  ForwardOutput o;
  ASSERT_TRUE(forward(f.w, s, std::span(toks).first(n_prefill), opt, &o));
  const float* last_layer = o.hidden.data() + (f.w.hp.n_layer - 1) * n_prefill * H;
  for (int t = 0; t < n_prefill; ++t) check_rms(last_layer + t * H, t);
  for (int t = n_prefill; t < n_total; ++t) {
    ASSERT_TRUE(forward(f.w, s, std::span(toks).subspan(t, 1), opt, &o));
    for (float v : o.logits) ASSERT_TRUE(std::isfinite(v)) << "token " << t;
    check_rms(o.hidden.data() + (f.w.hp.n_layer - 1) * H, t);
  }
}

TEST_P(ForwardByArch, BadInputLeavesSessionUnchanged) {
  Fixture f = load(GetParam());
  SessionState s = new_session(f.w, 16);
  ForwardOutput o;
  const std::vector<int32_t> ok = {1, 2, 3};
  ASSERT_TRUE(forward(f.w, s, ok, {}, &o));
  const SessionState before = s;
  const std::vector<int32_t> unknown = {5, static_cast<int32_t>(f.w.hp.n_vocab)};
  auto e = forward(f.w, s, unknown, {}, &o);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.error().message.find("index 1"), std::string::npos) << e.error().message;
  const std::vector<int32_t> negative = {-1};
  EXPECT_EQ(forward(f.w, s, negative, {}, &o).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(forward(f.w, s, std::span<const int32_t>(), {}, &o).error().code, ErrorCode::kInvalidArgument);
  const auto too_many = random_tokens(14, 1, 1000);
  auto full = forward(f.w, s, too_many, {}, &o);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, ErrorCode::kOutOfRange);
  EXPECT_NE(full.error().message.find("context limit"), std::string::npos);
  EXPECT_TRUE(s == before);
  EXPECT_FALSE(SessionState::create(f.w.hp, 0));
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ForwardByArch, ::testing::Values("tiny", "tiny-qwen3next", "tiny-qwen35"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = (c == '-') ? '_' : c;
                           return n;
                         });

// Guards against collapsed synthetic routing: over 256 tokens every MoE layer's router picks >= 90% of its experts.
TEST(ForwardRouting, TinyRoutersSpreadOverExperts) {
  Fixture f = load("tiny");
  ASSERT_TRUE(f.w.hp.is_moe());
  SessionState s = new_session(f.w, 512);
  ForwardOptions opt;
  opt.capture_routing = true;
  ForwardOutput o;
  const int n = 256;
  ASSERT_TRUE(forward(f.w, s, random_tokens(n, 21, 150000), opt, &o));
  const int k = static_cast<int>(f.w.hp.n_expert_used);
  for (uint32_t l = 0; l < f.w.hp.n_layer; ++l) {
    std::set<int32_t> used;
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < k; ++j) used.insert(o.routing[(static_cast<size_t>(l) * n + t) * k + j]);
    EXPECT_GE(used.size(), static_cast<size_t>(std::ceil(0.9 * f.w.hp.n_expert)))
        << "layer " << l << " routes to only " << used.size() << " of " << f.w.hp.n_expert << " experts";
  }
}

}  // namespace
}  // namespace kestrel::ref
