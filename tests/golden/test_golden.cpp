// Golden tests: Kestrel's scalar reference forward pass against numbers Hugging Face transformers produced
// (tests/golden/README.md; tools/golden/make_golden.py). For each fixture directory, the GGUF model beside it is run
// as one prefill and token by token, and every layer's residual stream and the logits are compared with HF's.
//
// Tolerance: errors are relative to the largest magnitude of the HF array being compared (per layer for hidden
// states), max|kestrel − hf| / max|hf|. Both sides compute in f32 from the same (dequantized) weights, but with
// different summation orders and algorithms (HF's batched matmuls vs the reference's index-order dot products; the
// chunked vs recurrent delta rule), so agreement is bounded by f32 rounding growing through the layers, not by 0.
// HF's own prefill and decode paths disagree by a measured amount recorded in golden.json
// (agreement_prefill_vs_decode: 2e-5 … 1.3e-4 on these models); no implementation can be held closer to HF than HF
// is to itself, so the bound per fixture is max(1e-4, 4 × that figure). Measured worst errors are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/model/model_hparams.h"
#include "core/model/weight_catalog.h"
#include "core/reference/forward.h"

namespace kestrel::ref {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kRelTolFloor = 1e-4;
constexpr double kSelfAgreementFactor = 4.0;

struct Fixture {
  fs::path dir;
  json meta;
  std::vector<char> bin;

  template <class T>
  std::vector<T> array(const std::string& name) const {
    for (const auto& a : meta["arrays"]) {
      if (a["name"] == name) {
        const size_t off = a["offset"].get<size_t>(), n = a["nbytes"].get<size_t>();
        std::vector<T> v(n / sizeof(T));
        std::memcpy(v.data(), bin.data() + off, n);
        return v;
      }
    }
    ADD_FAILURE() << "array " << name << " missing in " << dir;
    return {};
  }
  bool has(const std::string& name) const {
    for (const auto& a : meta["arrays"])
      if (a["name"] == name) return true;
    return false;
  }
};

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> dirs;
  const fs::path root = fs::path(KESTREL_GOLDEN_DIR) / "fixtures";
  if (!fs::exists(root)) return dirs;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && fs::exists(e.path() / "golden.json")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

Fixture read_fixture(const fs::path& dir) {
  Fixture f;
  f.dir = dir;
  std::ifstream js(dir / "golden.json");
  f.meta = json::parse(js);
  // fread rather than istreambuf_iterator: GCC 12 reports a false -Wnull-dereference inside the latter.
  f.bin.resize(fs::file_size(dir / "golden.bin"));
  std::FILE* b = std::fopen((dir / "golden.bin").c_str(), "rb");
  EXPECT_NE(b, nullptr);
  if (b != nullptr) {
    EXPECT_EQ(std::fread(f.bin.data(), 1, f.bin.size(), b), f.bin.size());
    std::fclose(b);
  }
  EXPECT_EQ(f.bin.size(), f.meta["bin_bytes"].get<size_t>());
  return f;
}

// max|a − b| / max|b| over n values.
double rel_err(const float* a, const float* b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::abs(static_cast<double>(b[i])));
  }
  return m > 0 ? d / m : d;
}

struct GoldenRun {
  std::vector<float> hidden;  // [n_layer][N][H]
  std::vector<float> logits;  // [N][V]
};

class Golden : public ::testing::TestWithParam<fs::path> {};

TEST_P(Golden, MatchesTransformers) {
  const Fixture fx = read_fixture(GetParam());
  const std::string gguf_name = fx.meta["gguf"]["file"].get<std::string>();
  const fs::path gguf_path = fx.dir / gguf_name;
  ASSERT_TRUE(fs::exists(gguf_path)) << "fixture model missing: " << gguf_path;
  auto file = GgufFile::open(gguf_path.string());
  ASSERT_TRUE(file) << file.error().to_string();
  ASSERT_EQ(file->file_size(), fx.meta["gguf"]["bytes"].get<uint64_t>())
      << "the GGUF is not the one the fixture was made from";
  auto hp = ModelHparams::from_gguf(*file);
  ASSERT_TRUE(hp) << hp.error().to_string();
  auto cat = WeightCatalog::build(*file, *hp);
  ASSERT_TRUE(cat) << cat.error().to_string();
  auto w = RefModelWeights::from_catalog(*cat);
  ASSERT_TRUE(w) << w.error().to_string();
  EXPECT_EQ(std::string(arch_name(hp->arch)), fx.meta["arch"].get<std::string>());

  const json& agree = fx.meta["agreement_prefill_vs_decode"];
  const double hf_self = std::max(agree["hidden_max_rel"].get<double>(), agree["logits"]["max_rel"].get<double>());
  const double rel_tol = std::max(kRelTolFloor, kSelfAgreementFactor * hf_self);

  const std::vector<int32_t> toks = fx.meta["token_ids"].get<std::vector<int32_t>>();
  const size_t N = toks.size(), H = hp->n_embd, V = hp->n_vocab, L = hp->n_layer;
  ASSERT_GE(N, 80u);

  // Prefill: one forward over all tokens (chunked GDN).
  GoldenRun pre;
  {
    auto s = SessionState::create(*hp, static_cast<int>(N) + 8);
    ASSERT_TRUE(s);
    ForwardOptions opt;
    opt.all_logits = true;
    opt.capture_hidden = true;
    ForwardOutput o;
    ASSERT_TRUE(forward(*w, *s, toks, opt, &o));
    pre.hidden = std::move(o.hidden);
    pre.logits = std::move(o.logits);
  }
  // Decode: token by token (recurrent GDN).
  GoldenRun dec;
  dec.hidden.assign(L * N * H, 0.0f);
  dec.logits.assign(N * V, 0.0f);
  {
    auto s = SessionState::create(*hp, static_cast<int>(N) + 8);
    ASSERT_TRUE(s);
    ForwardOptions opt;
    opt.capture_hidden = true;
    opt.gdn_mode = GdnMode::kRecurrent;
    for (size_t t = 0; t < N; ++t) {
      ForwardOutput o;
      ASSERT_TRUE(forward(*w, *s, std::span(toks).subspan(t, 1), opt, &o));
      for (size_t l = 0; l < L; ++l) std::copy_n(o.hidden.begin() + l * H, H, dec.hidden.begin() + (l * N + t) * H);
      std::copy_n(o.logits.begin(), V, dec.logits.begin() + t * V);
    }
  }

  double worst = 0;
  for (const char* mode : {"prefill", "decode"}) {
    const GoldenRun& run = std::string(mode) == "prefill" ? pre : dec;
    const auto hf_hidden = fx.array<float>(std::string(mode) + "_hidden");
    ASSERT_EQ(hf_hidden.size(), L * N * H);
    for (size_t l = 0; l < L; ++l) {
      const double e = rel_err(run.hidden.data() + l * N * H, hf_hidden.data() + l * N * H, N * H);
      worst = std::max(worst, e);
      EXPECT_LT(e, rel_tol) << mode << " hidden state after layer " << l;
    }
    const auto hf_logits = fx.array<float>(std::string(mode) + "_logits");
    const std::vector<int> positions = fx.meta["logits"]["positions"].get<std::vector<int>>();
    ASSERT_EQ(hf_logits.size(), positions.size() * V);
    for (size_t i = 0; i < positions.size(); ++i) {
      const double e = rel_err(run.logits.data() + positions[i] * V, hf_logits.data() + i * V, V);
      worst = std::max(worst, e);
      EXPECT_LT(e, rel_tol) << mode << " logits at position " << positions[i];
    }
    if (fx.has(std::string(mode) + "_topk_ids")) {  // large vocabularies: HF's top-k at every position
      const auto ids = fx.array<int32_t>(std::string(mode) + "_topk_ids");
      const auto vals = fx.array<float>(std::string(mode) + "_topk_logits");
      const size_t k = ids.size() / N;
      for (size_t t = 0; t < N; ++t) {
        const float* row = run.logits.data() + t * V;
        const float scale = std::max(std::abs(vals[t * k]), 1e-6f);
        for (size_t j = 0; j < k; ++j) {
          const double e = std::abs(row[ids[t * k + j]] - vals[t * k + j]) / scale;
          worst = std::max(worst, e);
          EXPECT_LT(e, rel_tol) << mode << " top-k logit " << j << " at position " << t;
        }
      }
    }
  }
  std::printf("golden %s: worst relative error vs transformers %.3g (bound %.3g; HF prefill vs HF decode %.3g)\n",
              fx.dir.filename().c_str(), worst, rel_tol, hf_self);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(fixture_dirs()), [](const auto& param_info) {
  std::string n = param_info.param.filename().string();
  for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
});

// The fixtures are committed: a checkout without them is broken, not skipped.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Golden);

TEST(GoldenFixtures, Present) { EXPECT_GE(fixture_dirs().size(), 3u) << "expected one fixture per architecture"; }

}  // namespace
}  // namespace kestrel::ref
