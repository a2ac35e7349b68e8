// Tests of kestrel-mkmodel's writer on the tiny presets: each file reads back with GgufFile, holds every tensor of
// expected_tensors() with the planned shape and type, its hparams round-trip through ModelHparams::from_gguf, it
// passes the WeightCatalog, and its tokenizer is the Qwen3 vocabulary. Same seed -> identical bytes for any thread
// count and chunk size; another seed -> different weights; every large weight is zero-mean after dequantization.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/model/model_hparams.h"
#include "core/model/weight_catalog.h"
#include "core/quant/quant.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/core/model/model_test_util.h"
#include "tools/mkmodel/model_plan.h"
#include "tools/mkmodel/model_writer.h"
#include "tools/mkmodel/presets.h"
#include "tools/mkmodel/vocab_source.h"

namespace kestrel::mkmodel {
namespace {

namespace fs = std::filesystem;

const std::string kVocabJson = std::string(KESTREL_TEST_DATA_DIR) + "/tokenizer/qwen3/tokenizer.json";

class MkModelWrite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto v = load_vocab(kVocabJson, 151936);
    ASSERT_TRUE(v.has_value()) << v.error().to_string();
    vocab_ = std::make_unique<TokenizerVocab>(std::move(*v));
  }
  static void TearDownTestSuite() { vocab_.reset(); }

  static ModelPlan plan(const std::string& preset, PlanOptions options = {}) {
    auto p = find_preset(preset);
    EXPECT_TRUE(p.has_value());
    auto pl = make_model_plan(*p, options);
    EXPECT_TRUE(pl.has_value()) << (pl ? "" : pl.error().to_string());
    return *pl;
  }

  // Writes `plan` under the test temp dir and returns the path ("" after a failure).
  static std::string write(const ModelPlan& plan, const std::string& file, unsigned threads = 2,
                           uint64_t chunk_bytes = uint64_t{8} << 20) {
    // The process id keeps test runs of other checkouts on this machine from rewriting the file while it is mapped.
    const std::string path = ::testing::TempDir() + "/mkmodel_" + std::to_string(::getpid()) + "_" + file;
    WriteOptions wo;
    wo.threads = threads;
    wo.chunk_bytes = chunk_bytes;
    auto stats = write_model(
        plan, path, [](GgufWriter& w) { return add_vocab_metadata(w, *vocab_); }, wo);
    EXPECT_TRUE(stats.has_value()) << (stats ? "" : stats.error().to_string());
    if (!stats) return "";
    EXPECT_EQ(stats->file_bytes, fs::file_size(path));
    return path;
  }

  static GgufFile open(const std::string& path) {
    auto f = GgufFile::open(path);
    EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().to_string());
    return std::move(*f);
  }

  static std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  static std::unique_ptr<TokenizerVocab> vocab_;
};

std::unique_ptr<TokenizerVocab> MkModelWrite::vocab_;

TEST_F(MkModelWrite, TinyPresetsReadBackComplete) {
  for (const std::string name : {"tiny", "tiny-qwen3next", "tiny-qwen35"}) {
    SCOPED_TRACE(name);
    const ModelPlan pl = plan(name);
    const std::string path = write(pl, name + ".gguf");
    ASSERT_FALSE(path.empty());
    const GgufFile file = open(path);

    // Every planned tensor, in order, with its shape and type.
    ASSERT_EQ(file.tensors().size(), pl.tensors.size());
    for (size_t i = 0; i < pl.tensors.size(); ++i) {
      const GgufTensorInfo& info = file.tensors()[i];
      EXPECT_EQ(info.name, pl.tensors[i].spec.name);
      EXPECT_EQ(info.ne, pl.tensors[i].spec.ne) << info.name;
      EXPECT_EQ(info.type, pl.tensors[i].type) << info.name;
      EXPECT_EQ(info.n_bytes, pl.tensors[i].n_bytes) << info.name;
    }
    for (const TensorSpec& spec : expected_tensors(pl.preset.hparams, pl.layout)) {
      const GgufTensorInfo* info = file.find_tensor(spec.name);
      ASSERT_NE(info, nullptr) << spec.name;
      EXPECT_EQ(info->ne, spec.ne) << spec.name;
    }

    auto hp = ModelHparams::from_gguf(file);
    ASSERT_TRUE(hp.has_value()) << hp.error().to_string();
    test::expect_same_hparams(*hp, pl.preset.hparams);

    auto catalog = WeightCatalog::build(file, *hp);
    ASSERT_TRUE(catalog.has_value()) << catalog.error().to_string();
    EXPECT_EQ(catalog->globals().tied_output, pl.layout.tied_output);
    EXPECT_EQ(catalog->n_used_tensors(), pl.tensors.size());

    auto tok = Tokenizer::from_gguf(file);
    ASSERT_TRUE(tok.has_value()) << tok.error().to_string();
    EXPECT_EQ(tok->n_vocab(), 151936);
    EXPECT_EQ(tok->vocab().pre, "qwen2");
    auto reference = Tokenizer::from_vocab(*vocab_);
    ASSERT_TRUE(reference.has_value());
    const std::string text = "<|im_start|>user\nHello, world! 123 kestrel<|im_end|>";
    EXPECT_EQ(tok->encode(text, true), reference->encode(text, true));

    EXPECT_EQ(file.get_string("general.architecture").value(), std::string(arch_name(pl.preset.hparams.arch)));
    EXPECT_EQ(file.get_u64("general.file_type").value(), 15u);
    EXPECT_EQ(file.get_string("kestrel.mkmodel.preset").value(), name);
    EXPECT_EQ(file.get_u64("kestrel.mkmodel.seed").value(), kDefaultSeed);
    const std::string arch(arch_name(pl.preset.hparams.arch));
    EXPECT_EQ(file.get_u64(arch + ".full_attention_interval").value(), 4u);
    if (pl.preset.hparams.arch != Arch::kQwen3Next) {
      EXPECT_EQ(file.get_int_array(arch + ".rope.dimension_sections").value(), (std::vector<int64_t>{11, 11, 10, 0}));
    } else {
      EXPECT_EQ(file.find(arch + ".rope.dimension_sections"), nullptr);
    }
    fs::remove(path);
  }
}

TEST_F(MkModelWrite, SameSeedSameBytesForAnyThreadsAndChunks) {
  const ModelPlan pl = plan("tiny");
  const std::string a = write(pl, "det_a.gguf", /*threads=*/1, /*chunk_bytes=*/1000);
  const std::string b = write(pl, "det_b.gguf", /*threads=*/3, /*chunk_bytes=*/uint64_t{1} << 20);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  const std::vector<uint8_t> bytes_a = read_bytes(a);
  EXPECT_GT(bytes_a.size(), uint64_t{10} << 20);
  EXPECT_TRUE(bytes_a == read_bytes(b));
  fs::remove(a);
  fs::remove(b);
}

TEST_F(MkModelWrite, DifferentSeedDifferentWeights) {
  PlanOptions o1;
  o1.seed = 1;
  PlanOptions o2;
  o2.seed = 2;
  const std::string a = write(plan("tiny-qwen35", o1), "seed1.gguf");
  const std::string b = write(plan("tiny-qwen35", o2), "seed2.gguf");
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  const GgufFile fa = open(a);
  const GgufFile fb = open(b);
  ASSERT_EQ(fa.tensors().size(), fb.tensors().size());
  for (size_t i = 0; i < fa.tensors().size(); ++i) {
    const auto da = fa.tensor_data(fa.tensors()[i]);
    const auto db = fb.tensor_data(fb.tensors()[i]);
    ASSERT_EQ(da.size(), db.size());
    EXPECT_FALSE(std::equal(da.begin(), da.end(), db.begin())) << fa.tensors()[i].name;
  }
  EXPECT_EQ(fb.get_u64("kestrel.mkmodel.seed").value(), 2u);
  fs::remove(a);
  fs::remove(b);
}

TEST_F(MkModelWrite, LargeWeightsAreZeroMeanAfterDequantization) {
  for (const std::string name : {"tiny", "tiny-qwen3next", "tiny-qwen35"}) {
    SCOPED_TRACE(name);
    const ModelPlan pl = plan(name);
    const std::string path = write(pl, "zm_" + name + ".gguf");
    ASSERT_FALSE(path.empty());
    const GgufFile file = open(path);
    int checked = 0;
    for (const PlannedTensor& t : pl.tensors) {
      if (t.init.kind != InitKind::kZeroMean || t.n_elements < 16384) continue;
      const GgufTensorInfo* info = file.find_tensor(t.spec.name);
      ASSERT_NE(info, nullptr);
      std::vector<float> v(info->n_elements);
      const Status s =
          dequantize_row(info->type, file.tensor_data(*info).data(), v.data(), static_cast<int64_t>(v.size()));
      ASSERT_TRUE(s.has_value()) << s.error().to_string();
      double sum = 0.0;
      double sum2 = 0.0;
      for (float x : v) {
        ASSERT_TRUE(std::isfinite(x)) << t.spec.name;
        sum += x;
        sum2 += static_cast<double>(x) * x;
      }
      const double mean = sum / static_cast<double>(v.size());
      const double sd = std::sqrt(sum2 / static_cast<double>(v.size()) - mean * mean);
      // >= 16384 samples: the standard error of the mean is <= std/128; 0.05 std is > 6 standard errors.
      EXPECT_LT(std::fabs(mean), 0.05 * sd) << t.spec.name << " (" << ggml_type_name(t.type) << ")";
      EXPECT_NEAR(sd, t.init.std, 0.2 * t.init.std) << t.spec.name << " (" << ggml_type_name(t.type) << ")";
      ++checked;
    }
    EXPECT_GE(checked, 20);
    fs::remove(path);
  }
}

TEST_F(MkModelWrite, UniformTypeAndLegacyLayoutFiles) {
  PlanOptions o;
  o.uniform_type = GgmlType::kQ4_0;
  o.gdn_input = GdnInputLayout::kLegacySsmIn;
  const ModelPlan pl = plan("tiny-qwen3next", o);
  const std::string path = write(pl, "q4_0_legacy.gguf");
  ASSERT_FALSE(path.empty());
  const GgufFile file = open(path);
  for (size_t i = 0; i < pl.tensors.size(); ++i) {
    EXPECT_EQ(file.tensors()[i].type, pl.tensors[i].spec.quantizable ? GgmlType::kQ4_0 : GgmlType::kF32)
        << pl.tensors[i].spec.name;
  }
  EXPECT_EQ(file.get_u64("general.file_type").value(), 2u);
  EXPECT_NE(file.find_tensor("blk.0.ssm_in.weight"), nullptr);
  auto hp = ModelHparams::from_gguf(file);
  ASSERT_TRUE(hp.has_value()) << hp.error().to_string();
  auto catalog = WeightCatalog::build(file, *hp);
  ASSERT_TRUE(catalog.has_value()) << catalog.error().to_string();
  EXPECT_EQ(catalog->layout().gdn_input, GdnInputLayout::kLegacySsmIn);
  fs::remove(path);
}

TEST_F(MkModelWrite, UnwritablePathIsAnErrorAndLeavesNothing) {
  const ModelPlan pl = plan("tiny");
  const std::string path = ::testing::TempDir() + "/mkmodel_no_such_dir/x.gguf";
  auto stats = write_model(pl, path, nullptr, WriteOptions{});
  ASSERT_FALSE(stats.has_value());
  EXPECT_FALSE(fs::exists(path));
}

TEST(MkModelVocab, FindsTheSourceTreeVocabulary) {
  auto found = find_vocab_file("");
  ASSERT_TRUE(found.has_value()) << found.error().to_string();
  EXPECT_TRUE(fs::exists(*found));
  auto missing = find_vocab_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("/nonexistent/tokenizer.json"), std::string::npos);
  const std::vector<std::string> candidates = vocab_candidates("x.json");
  ASSERT_GE(candidates.size(), 2u);
  EXPECT_EQ(candidates.front(), "x.json");
  EXPECT_NE(candidates[1].find("kestrel/tokenizer/qwen3/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::mkmodel
