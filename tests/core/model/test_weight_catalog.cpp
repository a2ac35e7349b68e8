// WeightCatalog on small hand-built GGUF files: a complete file per architecture is accepted and exposes typed
// references and byte accounting; each kind of problem (missing tensor, wrong shape, wrong type, unexpected tensor)
// is reported, all at once; the layouts real files use ({H,1} shared gate, legacy ssm_in, tied output, MTP blocks,
// F16 router) are accepted.
#include <gtest/gtest.h>

#include <string>

#include "core/gguf/gguf_reader.h"
#include "core/model/weight_catalog.h"
#include "tests/core/model/model_test_util.h"

namespace kestrel {
namespace {

using test::TensorDef;

struct Built {
  std::unique_ptr<GgufFile> file;  // kept alive: the catalog points into it
  Expected<WeightCatalog> cat = make_error(ErrorCode::kInternal, "not built");
};

Built build(const ModelHparams& hp, const std::vector<TensorDef>& defs, const char* name = "catalog.gguf") {
  Built b;
  const std::string path = test::write_gguf(name, test::hparams_metadata(hp), defs);
  auto file = GgufFile::open(path);
  if (!file) {
    b.cat = file.error();
    return b;
  }
  b.file = std::make_unique<GgufFile>(std::move(*file));
  auto hp_read = ModelHparams::from_gguf(*b.file);
  if (!hp_read) {
    b.cat = hp_read.error();
    return b;
  }
  b.cat = WeightCatalog::build(*b.file, *hp_read);
  return b;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class CatalogArchTest : public ::testing::TestWithParam<Arch> {};

TEST_P(CatalogArchTest, CompleteFileIsAcceptedWithTypedReferences) {
  const ModelHparams hp = test::tiny_hparams(GetParam());
  const std::vector<TensorDef> defs = test::model_tensors(hp);
  Built b = build(hp, defs);
  ASSERT_TRUE(b.cat) << b.cat.error().to_string();
  const WeightCatalog& cat = *b.cat;

  EXPECT_EQ(cat.layout().gdn_input, GdnInputLayout::kSplit);
  EXPECT_FALSE(cat.globals().tied_output);
  EXPECT_EQ(cat.globals().token_embd.name(), "token_embd.weight");
  EXPECT_EQ(cat.globals().output.name(), "output.weight");
  EXPECT_EQ(cat.globals().output_norm.ne(), (std::vector<uint64_t>{hp.n_embd}));
  ASSERT_EQ(cat.layers().size(), 4u);

  // Attention layer 3: name, shape, type and the bytes written for that tensor.
  const LayerWeights& l3 = cat.layer(3);
  EXPECT_EQ(l3.kind, LayerKind::kFullAttention);
  const TensorRef& q = l3.attn.q;
  ASSERT_TRUE(q.present());
  EXPECT_EQ(q.name(), "blk.3.attn_q.weight");
  EXPECT_EQ(q.ne(), (std::vector<uint64_t>{hp.n_embd, uint64_t{hp.n_head} * 2 * hp.head_dim}));
  EXPECT_EQ(q.type(), GgmlType::kF32);
  ASSERT_EQ(q.data.size(), q.n_bytes());
  size_t q_index = 0;
  while (defs[q_index].name != "blk.3.attn_q.weight") ++q_index;
  EXPECT_EQ(q.data.front(), test::fill_byte(q_index));
  EXPECT_EQ(q.data.back(), test::fill_byte(q_index));
  EXPECT_TRUE(l3.attn.k_norm.present());
  EXPECT_FALSE(l3.gdn.qkv.present());

  // GDN layer 0.
  const LayerWeights& l0 = cat.layer(0);
  EXPECT_EQ(l0.kind, LayerKind::kGatedDeltaNet);
  EXPECT_EQ(l0.gdn.qkv.ne_at(1), hp.ssm_conv_dim());
  EXPECT_EQ(l0.gdn.conv1d.ne(), (std::vector<uint64_t>{hp.ssm_conv_kernel, hp.ssm_conv_dim()}));
  EXPECT_TRUE(l0.gdn.a.present());
  EXPECT_FALSE(l0.gdn.ssm_in.present());
  EXPECT_FALSE(l0.attn.q.present());
  if (GetParam() == Arch::kQwen3Next) {
    EXPECT_TRUE(l0.gdn.ba.present());
    EXPECT_FALSE(l0.gdn.beta.present());
  } else {
    EXPECT_TRUE(l0.gdn.beta.present());
    EXPECT_TRUE(l0.gdn.alpha.present());
    EXPECT_FALSE(l0.gdn.ba.present());
  }
  // FFN.
  if (hp.is_moe()) {
    EXPECT_TRUE(l0.ffn.is_moe());
    EXPECT_TRUE(l0.ffn.has_shared_expert());
    EXPECT_EQ(l0.ffn.down_exps.ne(), (std::vector<uint64_t>{hp.n_ff_expert, hp.n_embd, hp.n_expert}));
    EXPECT_FALSE(l0.ffn.gate.present());
  } else {
    EXPECT_FALSE(l0.ffn.is_moe());
    EXPECT_EQ(l0.ffn.down.ne(), (std::vector<uint64_t>{hp.n_ff_dense, hp.n_embd}));
  }

  // Byte accounting: everything used, per placement and per type sums to the total.
  uint64_t sum = 0;
  for (const GgufTensorInfo& t : b.file->tensors()) sum += t.n_bytes;
  EXPECT_EQ(cat.total_bytes(), sum);
  EXPECT_EQ(cat.n_used_tensors(), defs.size());
  EXPECT_EQ(cat.n_skipped(), 0u);
  uint64_t by_placement = 0;
  for (size_t c = 0; c < kNumPlacementClasses; ++c) by_placement += cat.bytes_in(static_cast<PlacementClass>(c));
  EXPECT_EQ(by_placement, sum);
  ASSERT_EQ(cat.bytes_by_type().size(), 1u);
  EXPECT_EQ(cat.bytes_by_type()[0].type, GgmlType::kF32);
  EXPECT_EQ(cat.bytes_by_type()[0].bytes, sum);
  const uint64_t embd = 2 * cat.globals().token_embd.n_bytes() + cat.globals().output_norm.n_bytes();
  EXPECT_EQ(cat.bytes_in(PlacementClass::kEmbedding), embd);
  EXPECT_EQ(cat.bytes_in(PlacementClass::kRoutedExperts) > 0, hp.is_moe());
  EXPECT_EQ(cat.entries().size(), defs.size());
}

INSTANTIATE_TEST_SUITE_P(AllArchs, CatalogArchTest,
                         ::testing::Values(Arch::kQwen35Moe, Arch::kQwen3Next, Arch::kQwen35),
                         [](const auto& p) { return std::string(arch_name(p.param)); });

TEST(WeightCatalog, MissingTensor) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  auto defs = test::model_tensors(hp);
  ASSERT_TRUE(test::erase_def(defs, "blk.2.ssm_a"));
  Built b = build(hp, defs);
  ASSERT_FALSE(b.cat);
  EXPECT_EQ(b.cat.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(b.cat.error().message, "missing blk.2.ssm_a");
}

TEST(WeightCatalog, WrongShape) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  auto defs = test::model_tensors(hp);
  TensorDef* q = test::find_def(defs, "blk.3.attn_q.weight");
  ASSERT_NE(q, nullptr);
  q->ne = {hp.n_embd, uint64_t{hp.n_head} * hp.head_dim};  // forgot the gate half
  Built b = build(hp, defs);
  ASSERT_FALSE(b.cat);
  EXPECT_EQ(b.cat.error().message, "blk.3.attn_q.weight has shape {64, 64}, expected {64, 128}");
}

TEST(WeightCatalog, WrongTypes) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  {
    auto defs = test::model_tensors(hp);
    test::find_def(defs, "blk.0.attn_norm.weight")->type = GgmlType::kF16;  // norms must be f32
    Built b = build(hp, defs);
    ASSERT_FALSE(b.cat);
    EXPECT_EQ(b.cat.error().code, ErrorCode::kUnsupported);
    EXPECT_EQ(b.cat.error().message, "blk.0.attn_norm.weight has type f16, expected f32");
  }
  {
    auto defs = test::model_tensors(hp);
    test::find_def(defs, "blk.1.ffn_up_exps.weight")->type = GgmlType::kI32;  // not a weight format
    Built b = build(hp, defs);
    ASSERT_FALSE(b.cat);
    EXPECT_EQ(b.cat.error().code, ErrorCode::kUnsupported);
    EXPECT_TRUE(contains(b.cat.error().message,
                         "blk.1.ffn_up_exps.weight has type i32, expected a type Kestrel can "
                         "dequantize (f32, f16, bf16"))
        << b.cat.error().message;
  }
  {
    auto defs = test::model_tensors(hp);
    test::find_def(defs, "blk.2.ffn_gate_inp.weight")->type = GgmlType::kQ8_0;  // router: float only
    Built b = build(hp, defs);
    ASSERT_FALSE(b.cat);
    EXPECT_EQ(b.cat.error().message, "blk.2.ffn_gate_inp.weight has type q8_0, expected f32, f16 or bf16");
  }
}

TEST(WeightCatalog, HalfPrecisionBigWeightsAndRouterAreAccepted) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  auto defs = test::model_tensors(hp);
  test::find_def(defs, "blk.0.ffn_gate_inp.weight")->type = GgmlType::kF16;
  test::find_def(defs, "blk.0.ffn_gate_inp_shexp.weight")->type = GgmlType::kBF16;
  test::find_def(defs, "blk.0.attn_qkv.weight")->type = GgmlType::kBF16;
  test::find_def(defs, "blk.3.attn_q.weight")->type = GgmlType::kQ8_0;
  test::find_def(defs, "token_embd.weight")->type = GgmlType::kF16;
  Built b = build(hp, defs);
  ASSERT_TRUE(b.cat) << b.cat.error().message;
  EXPECT_EQ(b.cat->layer(0).ffn.router.type(), GgmlType::kF16);
  EXPECT_EQ(b.cat->layer(3).attn.q.type(), GgmlType::kQ8_0);
  // Largest type first.
  ASSERT_GE(b.cat->bytes_by_type().size(), 4u);
  EXPECT_EQ(b.cat->bytes_by_type()[0].type, GgmlType::kF32);
  uint64_t sum = 0;
  for (const TypeBytes& t : b.cat->bytes_by_type()) sum += t.bytes;
  EXPECT_EQ(sum, b.cat->total_bytes());
}

TEST(WeightCatalog, SharedExpertGateMayHaveATrailingUnitDim) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen3Next);
  for (const std::vector<uint64_t>& ne : {std::vector<uint64_t>{hp.n_embd}, std::vector<uint64_t>{hp.n_embd, 1}}) {
    auto defs = test::model_tensors(hp);
    for (uint32_t i = 0; i < hp.n_layer; ++i) {
      test::find_def(defs, "blk." + std::to_string(i) + ".ffn_gate_inp_shexp.weight")->ne = ne;
    }
    Built b = build(hp, defs);
    ASSERT_TRUE(b.cat) << b.cat.error().message;
    EXPECT_EQ(b.cat->layer(1).ffn.shared_gate_inp.ne(), ne);
  }
  // A trailing dim that is not 1 still differs.
  auto defs = test::model_tensors(hp);
  test::find_def(defs, "blk.1.ffn_gate_inp_shexp.weight")->ne = {hp.n_embd, 2};
  Built b = build(hp, defs);
  ASSERT_FALSE(b.cat);
  EXPECT_EQ(b.cat.error().message, "blk.1.ffn_gate_inp_shexp.weight has shape {64, 2}, expected {64}");
}

TEST(WeightCatalog, ShapesEquivalent) {
  const std::vector<uint64_t> a{64}, a1{64, 1}, a11{64, 1, 1}, b{64, 2}, c{1, 64};
  EXPECT_TRUE(shapes_equivalent(a, a1));
  EXPECT_TRUE(shapes_equivalent(a11, a));
  EXPECT_FALSE(shapes_equivalent(a, b));
  EXPECT_FALSE(shapes_equivalent(a, c));
}

TEST(WeightCatalog, LegacySsmInAcceptedForQwen3Next) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen3Next);
  LayoutOptions legacy;
  legacy.gdn_input = GdnInputLayout::kLegacySsmIn;
  Built b = build(hp, test::model_tensors(hp, legacy));
  ASSERT_TRUE(b.cat) << b.cat.error().message;
  EXPECT_EQ(b.cat->layout().gdn_input, GdnInputLayout::kLegacySsmIn);
  const GdnWeights& g = b.cat->layer(0).gdn;
  ASSERT_TRUE(g.ssm_in.present());
  EXPECT_EQ(g.ssm_in.ne_at(1), 2 * hp.ssm_key_dim() + 2 * hp.ssm_inner);
  EXPECT_TRUE(g.ba.present());
  EXPECT_FALSE(g.qkv.present());
  EXPECT_FALSE(g.gate.present());
}

TEST(WeightCatalog, LegacySsmInRefusedForQwen35) {
  // qwen35* never had the legacy layout: a file using it is missing attn_qkv/attn_gate/ssm_beta/ssm_alpha.
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  auto defs = test::model_tensors(hp);
  ASSERT_TRUE(test::erase_def(defs, "blk.0.attn_qkv.weight"));
  defs.push_back({"blk.0.ssm_in.weight", {hp.n_embd, 2 * hp.ssm_key_dim() + 2 * hp.ssm_inner}, GgmlType::kF32});
  Built b = build(hp, defs);
  ASSERT_FALSE(b.cat);
  EXPECT_TRUE(contains(b.cat.error().message, "missing blk.0.attn_qkv.weight")) << b.cat.error().message;
  EXPECT_TRUE(contains(b.cat.error().message, "unexpected tensor blk.0.ssm_in.weight")) << b.cat.error().message;
}

TEST(WeightCatalog, TiedOutputAccepted) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35);
  LayoutOptions tied;
  tied.tied_output = true;
  auto defs = test::model_tensors(hp, tied);
  ASSERT_EQ(test::find_def(defs, "output.weight"), nullptr);
  Built b = build(hp, defs);
  ASSERT_TRUE(b.cat) << b.cat.error().message;
  EXPECT_TRUE(b.cat->layout().tied_output);
  EXPECT_TRUE(b.cat->globals().tied_output);
  EXPECT_EQ(b.cat->globals().output.info, b.cat->globals().token_embd.info);
  EXPECT_EQ(b.cat->globals().output.data.data(), b.cat->globals().token_embd.data.data());
  // Counted once.
  EXPECT_EQ(b.cat->bytes_in(PlacementClass::kEmbedding),
            b.cat->globals().token_embd.n_bytes() + b.cat->globals().output_norm.n_bytes());
}

TEST(WeightCatalog, MtpBlockTensorsAreSkipped) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  hp.n_block = 5;
  hp.n_nextn = 1;
  auto defs = test::model_tensors(hp);
  const std::vector<TensorDef> mtp = {
      {"blk.4.attn_norm.weight", {hp.n_embd}, GgmlType::kF32},
      {"blk.4.attn_q.weight", {hp.n_embd, uint64_t{hp.n_head} * 2 * hp.head_dim}, GgmlType::kF32},
      {"blk.4.nextn.eh_proj.weight", {2 * uint64_t{hp.n_embd}, hp.n_embd}, GgmlType::kF32},
      {"blk.4.nextn.enorm.weight", {hp.n_embd}, GgmlType::kF32},
  };
  defs.insert(defs.end() - 2, mtp.begin(), mtp.end());  // between the main blocks and output_norm/output
  Built b = build(hp, defs);
  ASSERT_TRUE(b.cat) << b.cat.error().message;
  EXPECT_EQ(b.cat->n_skipped(), 4u);
  uint64_t skipped = 0, all = 0;
  for (const GgufTensorInfo& t : b.file->tensors()) {
    all += t.n_bytes;
    if (t.name.rfind("blk.4.", 0) == 0) skipped += t.n_bytes;
  }
  EXPECT_EQ(b.cat->skipped_bytes(), skipped);
  EXPECT_EQ(b.cat->total_bytes(), all - skipped);
  EXPECT_EQ(b.cat->n_used_tensors(), defs.size() - 4);
  size_t n_skipped_entries = 0;
  for (const CatalogEntry& e : b.cat->entries()) {
    if (e.skipped) {
      ++n_skipped_entries;
      EXPECT_EQ(e.layer, 4);
    }
  }
  EXPECT_EQ(n_skipped_entries, 4u);
  EXPECT_EQ(b.cat->layers().size(), 4u);
}

TEST(WeightCatalog, BlocksPastBlockCountAndStrayTensorsAreProblems) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  auto defs = test::model_tensors(hp);
  defs.push_back({"blk.9.attn_norm.weight", {hp.n_embd}, GgmlType::kF32});
  defs.push_back({"rope_freqs.weight", {4}, GgmlType::kF32});
  Built b = build(hp, defs);
  ASSERT_FALSE(b.cat);
  const std::string& m = b.cat.error().message;
  EXPECT_TRUE(contains(m, "2 problems: ")) << m;
  EXPECT_TRUE(contains(m, "unexpected tensor blk.9.attn_norm.weight (block 9 is past qwen35moe.block_count 4)")) << m;
  EXPECT_TRUE(contains(m, "unexpected tensor rope_freqs.weight")) << m;
}

TEST(WeightCatalog, AllProblemsAtOnce) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  auto defs = test::model_tensors(hp);
  ASSERT_TRUE(test::erase_def(defs, "blk.1.ssm_a"));
  test::find_def(defs, "blk.3.attn_k.weight")->ne = {hp.n_embd, 8};
  test::find_def(defs, "output_norm.weight")->type = GgmlType::kBF16;
  Built b = build(hp, defs);
  ASSERT_FALSE(b.cat);
  EXPECT_EQ(b.cat.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(b.cat.error().message,
            "3 problems: missing blk.1.ssm_a; blk.3.attn_k.weight has shape {64, 8}, expected {64, 32}; "
            "output_norm.weight has type bf16, expected f32");
}

TEST(WeightCatalog, ManyProblemsAreCappedInTheMessage) {
  // A 12-layer qwen35moe file checked as dense qwen35: every dense FFN tensor is missing, most GDN shapes differ
  // (Vh 4 vs 6), every expert tensor is unexpected: well over 100 problems, the first 100 listed.
  auto twelve_layers = [](Arch arch) {
    ModelHparams hp = test::tiny_hparams(arch);
    hp.n_block = hp.n_layer = 12;
    hp.layer_kinds.clear();
    for (uint32_t i = 0; i < 12; ++i) {
      hp.layer_kinds.push_back((i + 1) % 4 ? LayerKind::kGatedDeltaNet : LayerKind::kFullAttention);
    }
    return hp;
  };
  const ModelHparams moe = twelve_layers(Arch::kQwen35Moe);
  const ModelHparams dense = twelve_layers(Arch::kQwen35);
  const std::string path = test::write_gguf("mismatch.gguf", test::hparams_metadata(dense), test::model_tensors(moe));
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file) << file.error().to_string();
  auto hp = ModelHparams::from_gguf(*file);
  ASSERT_TRUE(hp) << hp.error().message;
  auto cat = WeightCatalog::build(*file, *hp);
  ASSERT_FALSE(cat);
  const std::string& m = cat.error().message;
  EXPECT_TRUE(contains(m, "missing blk.0.ffn_gate.weight")) << m;
  const size_t n_problems = std::stoul(m);
  EXPECT_GT(n_problems, 100u) << m;
  EXPECT_TRUE(contains(m, "; ... and " + std::to_string(n_problems - 100) + " more")) << m;
}

}  // namespace
}  // namespace kestrel
