// The models of the engine tests (CPU, CUDA, hybrid): the golden fixtures and the tiny presets of the three
// architectures, written once per test process with kestrel-mkmodel's library (including qwen3next's legacy ssm_in
// layout, a Q4_0 model and one every MoE layer of the CUDA engine runs on moe_imma).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "tests/core/engine/engine_test_util.h"
#include "tools/mkmodel/model_plan.h"
#include "tools/mkmodel/model_writer.h"
#include "tools/mkmodel/presets.h"
#include "tools/mkmodel/vocab_source.h"

namespace kestrel::test {

// How a tiny preset is written: qwen3next's legacy ssm_in layout; every quantizable tensor Q4_0; the shared expert's
// ff equal to the routed experts' (with Q4_0, what the CUDA engine's moe_imma path needs); wide: H and the experts'
// ff 256, so that every projection's input is whole 256-column groups (with Q4_0, a prompt pass's projections and
// experts all run on gemm_imma).
struct TinyModelOptions {
  bool legacy_ssm_in = false;
  bool q4_0 = false;
  bool shared_ff_as_expert = false;
  bool wide = false;
};

// Writes a tiny preset (with the Qwen3 vocabulary, so Model::open accepts it) into the test's temp dir, under a
// name holding the process id: ctest may run several test binaries (or one twice, at another level) at once,
// and rewriting a file another process has mapped would fault it.
inline std::string write_tiny(const std::string& preset_name, const std::string& file, const TinyModelOptions& o) {
  const std::string path = ::testing::TempDir() + "/" + std::to_string(getpid()) + "_" + file;
  auto preset = mkmodel::find_preset(preset_name);
  EXPECT_TRUE(preset.has_value());
  if (!preset) return "";
  mkmodel::PlanOptions po;
  if (o.legacy_ssm_in) po.gdn_input = GdnInputLayout::kLegacySsmIn;
  if (o.q4_0) po.uniform_type = GgmlType::kQ4_0;
  if (o.wide) {
    preset->hparams.n_embd = 256;
    preset->hparams.n_ff_expert = 256;
  }
  if (o.shared_ff_as_expert) preset->hparams.n_ff_shared = preset->hparams.n_ff_expert;
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

// The file of a test model: "golden-*" (a fixture), a tiny preset's name, "tiny-q4_0" (tiny with every quantizable
// tensor Q4_0), "tiny-imma" (tiny-q4_0 with the shared expert's ff equal to the experts': every MoE layer of the
// CUDA engine on moe_imma), "tiny-wide" (tiny-imma at H 256: prompt passes on gemm_imma) or "tiny-qwen3next-legacy"
// (the ssm_in layout); tiny presets are written once per process.
inline std::string model_path(const std::string& name) {
  if (name.starts_with("golden")) return fixture_model_path(name);
  // The files this process wrote, removed when it exits (each run writes its own, under its process id; left
  // behind, every test run would add its tiny models to the temp dir). Unlinking a file still mapped is safe.
  struct Written {
    std::map<std::string, std::string> paths;
    ~Written() {
      for (const auto& entry : paths) {
        if (!entry.second.empty()) std::remove(entry.second.c_str());
      }
    }
  };
  static Written written;
  std::string& path = written.paths[name];
  if (!path.empty()) return path;
  if (name == "tiny-q4_0") {
    path = write_tiny("tiny", "tiny_q4_0.gguf", {.q4_0 = true});
  } else if (name == "tiny-imma") {
    path = write_tiny("tiny", "tiny_imma.gguf", {.q4_0 = true, .shared_ff_as_expert = true});
  } else if (name == "tiny-wide") {
    path = write_tiny("tiny", "tiny_wide.gguf", {.q4_0 = true, .shared_ff_as_expert = true, .wide = true});
  } else if (name == "tiny-qwen3next-legacy") {
    path = write_tiny("tiny-qwen3next", "tiny_legacy.gguf", {.legacy_ssm_in = true});
  } else {
    path = write_tiny(name, name + ".gguf", {});
  }
  return path;
}

}  // namespace kestrel::test
