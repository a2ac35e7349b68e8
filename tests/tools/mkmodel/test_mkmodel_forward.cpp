// Guards kestrel-mkmodel's weight design with the reference forward pass (core/reference): on the tiny MoE presets a
// 128-token prefill of random ids keeps every activation finite, routes tokens onto every expert of every MoE layer
// (no routing collapse, as a biased Q4_0 nibble caused), keeps the residual stream from growing fast, and does not
// make every position predict its own input token (the tied-embedding self-copy trap).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/model/model_hparams.h"
#include "core/model/weight_catalog.h"
#include "core/reference/forward.h"
#include "tools/mkmodel/model_plan.h"
#include "tools/mkmodel/model_writer.h"
#include "tools/mkmodel/presets.h"

namespace kestrel::mkmodel {
namespace {

TEST(MkModelForward, TinyMoePresetsRouteEverywhereAndStayFinite) {
  for (const std::string name : {"tiny", "tiny-qwen3next"}) {
    SCOPED_TRACE(name);
    auto preset = find_preset(name);
    ASSERT_TRUE(preset.has_value());
    auto plan = make_model_plan(*preset, PlanOptions{});
    ASSERT_TRUE(plan.has_value());
    // No tokenizer metadata is needed by the forward pass.
    // The process id keeps test runs of other checkouts on this machine from rewriting the file while it is mapped.
    const std::string path = ::testing::TempDir() + "/mkmodel_fwd_" + std::to_string(::getpid()) + "_" + name + ".gguf";
    auto stats = write_model(*plan, path, nullptr, WriteOptions{});
    ASSERT_TRUE(stats.has_value()) << stats.error().to_string();

    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.has_value()) << file.error().to_string();
    auto hp = ModelHparams::from_gguf(*file);
    ASSERT_TRUE(hp.has_value()) << hp.error().to_string();
    auto catalog = WeightCatalog::build(*file, *hp);
    ASSERT_TRUE(catalog.has_value()) << catalog.error().to_string();
    auto weights = ref::RefModelWeights::from_catalog(*catalog);
    ASSERT_TRUE(weights.has_value()) << weights.error().to_string();

    const int n = 128;
    auto session = ref::SessionState::create(*hp, n);
    ASSERT_TRUE(session.has_value());
    std::vector<int32_t> tokens(n);
    uint64_t x = 12345;
    for (int32_t& t : tokens) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<int32_t>((x >> 33) % 151643);
    }
    ref::ForwardOptions options;
    options.all_logits = true;
    options.capture_hidden = true;
    options.capture_routing = true;
    ref::ForwardOutput out;
    const Status s = ref::forward(*weights, *session, tokens, options, &out);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();

    const size_t h = hp->n_embd;
    const size_t k = hp->n_expert_used;
    for (uint32_t l = 0; l < hp->n_layer; ++l) {
      double sum2 = 0.0;
      for (size_t i = 0; i < n * h; ++i) {
        const float v = out.hidden[l * n * h + i];
        ASSERT_TRUE(std::isfinite(v)) << "layer " << l;
        sum2 += static_cast<double>(v) * v;
      }
      const double rms = std::sqrt(sum2 / static_cast<double>(n * h));
      EXPECT_GT(rms, 0.1) << "layer " << l;
      EXPECT_LT(rms, 3.0) << "layer " << l;  // grows slowly (0.43 -> 0.95 over the 8 layers of tiny)
      std::set<int32_t> experts(out.routing.begin() + static_cast<ptrdiff_t>(l * n * k),
                                out.routing.begin() + static_cast<ptrdiff_t>((l + 1) * n * k));
      EXPECT_EQ(experts.size(), hp->n_expert) << "layer " << l;
    }
    int copies = 0;
    for (int t = 0; t < n; ++t) {
      const float* logits = out.logits.data() + static_cast<size_t>(t) * hp->n_vocab;
      int best = 0;
      for (uint32_t v = 0; v < hp->n_vocab; ++v) {
        ASSERT_TRUE(std::isfinite(logits[v]));
        if (logits[v] > logits[best]) best = static_cast<int>(v);
      }
      copies += best == tokens[t];
    }
    EXPECT_LT(copies, n / 10);
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace kestrel::mkmodel
