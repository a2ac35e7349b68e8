// ModelHparams::from_gguf / validate on hand-built GGUF files: the three architectures read back exactly, layer
// kinds from full_attention_interval and attention.recurrent_layers, MTP blocks, and every consistency rule producing
// an error that names its key.
#include <gtest/gtest.h>

#include <string>

#include "core/gguf/gguf_reader.h"
#include "core/model/model_hparams.h"
#include "tests/core/model/model_test_util.h"

namespace kestrel {
namespace {

using test::Metadata;

// A file with `md` and only token_embd.weight {H, n_vocab} (all from_gguf needs).
Expected<ModelHparams> read_hparams(const Metadata& md, const ModelHparams& hp, uint64_t vocab_rows = 0) {
  const uint64_t rows = vocab_rows ? vocab_rows : hp.n_vocab;
  const std::string path = test::write_gguf("hparams.gguf", md, {{"token_embd.weight", {hp.n_embd, rows}}});
  auto file = GgufFile::open(path);
  if (!file) return file.error();
  return ModelHparams::from_gguf(*file);
}

class HparamsArchTest : public ::testing::TestWithParam<Arch> {};

TEST_P(HparamsArchTest, ReadsBackWhatWasWritten) {
  const ModelHparams hp = test::tiny_hparams(GetParam());
  ASSERT_TRUE(hp.validate()) << hp.validate().error().message;
  auto got = read_hparams(test::hparams_metadata(hp), hp);
  ASSERT_TRUE(got) << got.error().to_string();
  test::expect_same_hparams(*got, hp);
  EXPECT_EQ(got->n_gdn_layers(), 3u);
  EXPECT_EQ(got->n_attn_layers(), 1u);
  EXPECT_EQ(got->head_mapping(), GetParam() == Arch::kQwen3Next ? HeadMapping::kGrouped : HeadMapping::kTiled);
  EXPECT_EQ(got->is_moe(), GetParam() != Arch::kQwen35);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, HparamsArchTest,
                         ::testing::Values(Arch::kQwen35Moe, Arch::kQwen3Next, Arch::kQwen35),
                         [](const auto& p) { return std::string(arch_name(p.param)); });

TEST(ModelHparams, ArchNames) {
  for (Arch a : {Arch::kQwen35Moe, Arch::kQwen35, Arch::kQwen3Next}) {
    auto back = arch_from_name(arch_name(a));
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, a);
  }
  auto bad = arch_from_name("llama");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kUnsupported);
}

TEST(ModelHparams, UnknownArchitectureNamesItAndTheSupportedOnes) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  Metadata md = test::hparams_metadata(hp);
  test::set_key(md, "general.architecture", GgufValue::string("llama"));
  auto got = read_hparams(md, hp);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, ErrorCode::kUnsupported);
  for (const char* s : {"general.architecture", "'llama'", "qwen35moe", "qwen35,", "qwen3next"}) {
    EXPECT_NE(got.error().message.find(s), std::string::npos) << s << " not in: " << got.error().message;
  }
}

TEST(ModelHparams, MissingOrMistypedArchitecture) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  Metadata md = test::hparams_metadata(hp);
  test::erase_key(md, "general.architecture");
  auto missing = read_hparams(md, hp);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("general.architecture"), std::string::npos);

  test::set_key(md, "general.architecture", GgufValue::u32(3));
  auto mistyped = read_hparams(md, hp);
  ASSERT_FALSE(mistyped);
  EXPECT_NE(mistyped.error().message.find("general.architecture"), std::string::npos);
}

TEST(ModelHparams, LayerKindsFromInterval) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  hp.n_block = hp.n_layer = 6;
  Metadata md = test::hparams_metadata(hp);
  test::set_key(md, "qwen35moe.full_attention_interval", GgufValue::u32(2));
  auto got = read_hparams(md, hp);
  ASSERT_TRUE(got) << got.error().message;
  using K = LayerKind;
  EXPECT_EQ(got->layer_kinds, (std::vector<K>{K::kGatedDeltaNet, K::kFullAttention, K::kGatedDeltaNet,
                                              K::kFullAttention, K::kGatedDeltaNet, K::kFullAttention}));

  // Absent: llama.cpp's default 4.
  test::erase_key(md, "qwen35moe.full_attention_interval");
  got = read_hparams(md, hp);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->layer_kinds, (std::vector<K>{K::kGatedDeltaNet, K::kGatedDeltaNet, K::kGatedDeltaNet,
                                              K::kFullAttention, K::kGatedDeltaNet, K::kGatedDeltaNet}));
}

TEST(ModelHparams, LayerKindsFromRecurrentLayersArray) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen3Next);
  Metadata md = test::hparams_metadata(hp);
  using K = LayerKind;
  const std::vector<K> want{K::kFullAttention, K::kGatedDeltaNet, K::kFullAttention, K::kGatedDeltaNet};

  std::vector<GgufValue> bools;
  for (K k : want) bools.push_back(GgufValue::boolean(k == K::kGatedDeltaNet));
  test::set_key(md, "qwen3next.attention.recurrent_layers", GgufValue::array(GgufValueType::kBool, bools));
  auto got = read_hparams(md, hp);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->layer_kinds, want);

  test::set_key(md, "qwen3next.attention.recurrent_layers", GgufValue::i32_array({0, 1, 0, 1}));
  got = read_hparams(md, hp);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->layer_kinds, want);

  test::set_key(md, "qwen3next.attention.recurrent_layers", GgufValue::i32_array({0, 1, 0}));
  got = read_hparams(md, hp);
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find("qwen3next.attention.recurrent_layers"), std::string::npos) << got.error().message;

  test::set_key(md, "qwen3next.attention.recurrent_layers", GgufValue::f32_array({0, 1, 0, 1}));
  got = read_hparams(md, hp);
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find("qwen3next.attention.recurrent_layers"), std::string::npos) << got.error().message;
}

TEST(ModelHparams, MtpBlocksAreNotMainLayers) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35);
  hp.n_block = 5;
  hp.n_nextn = 1;
  auto got = read_hparams(test::hparams_metadata(hp), hp);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->n_block, 5u);
  EXPECT_EQ(got->n_nextn, 1u);
  EXPECT_EQ(got->n_layer, 4u);
  EXPECT_EQ(got->layer_kinds.size(), 4u);
}

TEST(ModelHparams, VocabFromTokenEmbdCrossCheckedWithVocabSize) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  Metadata md = test::hparams_metadata(hp);
  test::set_key(md, "qwen35moe.vocab_size", GgufValue::u32(hp.n_vocab));
  auto got = read_hparams(md, hp);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->n_vocab, hp.n_vocab);

  got = read_hparams(md, hp, /*vocab_rows=*/hp.n_vocab + 32);
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find("qwen35moe.vocab_size"), std::string::npos) << got.error().message;

  // Without token_embd there is no vocabulary size.
  const std::string path = test::write_gguf("no_embd.gguf", test::hparams_metadata(hp), {});
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file) << file.error().to_string();
  auto no_embd = ModelHparams::from_gguf(*file);
  ASSERT_FALSE(no_embd);
  EXPECT_NE(no_embd.error().message.find("token_embd.weight"), std::string::npos);
}

// Every required key, removed, gives kNotFound naming it.
struct MissingKeyCase {
  Arch arch;
  const char* key;  // without the arch prefix
};

class HparamsMissingKeyTest : public ::testing::TestWithParam<MissingKeyCase> {};

TEST_P(HparamsMissingKeyTest, NamesTheKey) {
  const ModelHparams hp = test::tiny_hparams(GetParam().arch);
  Metadata md = test::hparams_metadata(hp);
  const std::string key = std::string(arch_name(hp.arch)) + "." + GetParam().key;
  ASSERT_TRUE(test::erase_key(md, key)) << key;
  auto got = read_hparams(md, hp);
  ASSERT_FALSE(got) << key;
  EXPECT_EQ(got.error().code, ErrorCode::kNotFound) << got.error().message;
  EXPECT_NE(got.error().message.find(key), std::string::npos) << got.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    RequiredKeys, HparamsMissingKeyTest,
    ::testing::Values(
        MissingKeyCase{Arch::kQwen35Moe, "block_count"}, MissingKeyCase{Arch::kQwen35Moe, "context_length"},
        MissingKeyCase{Arch::kQwen35Moe, "embedding_length"}, MissingKeyCase{Arch::kQwen35Moe, "attention.head_count"},
        MissingKeyCase{Arch::kQwen35Moe, "attention.head_count_kv"},
        MissingKeyCase{Arch::kQwen35Moe, "attention.key_length"},
        MissingKeyCase{Arch::kQwen35Moe, "attention.value_length"},
        MissingKeyCase{Arch::kQwen35Moe, "attention.layer_norm_rms_epsilon"},
        MissingKeyCase{Arch::kQwen35Moe, "rope.dimension_count"}, MissingKeyCase{Arch::kQwen35Moe, "rope.freq_base"},
        MissingKeyCase{Arch::kQwen35Moe, "rope.dimension_sections"},
        MissingKeyCase{Arch::kQwen35, "rope.dimension_sections"}, MissingKeyCase{Arch::kQwen35Moe, "ssm.conv_kernel"},
        MissingKeyCase{Arch::kQwen35Moe, "ssm.state_size"}, MissingKeyCase{Arch::kQwen35Moe, "ssm.group_count"},
        MissingKeyCase{Arch::kQwen35Moe, "ssm.time_step_rank"}, MissingKeyCase{Arch::kQwen35Moe, "ssm.inner_size"},
        MissingKeyCase{Arch::kQwen35Moe, "expert_count"}, MissingKeyCase{Arch::kQwen3Next, "expert_used_count"},
        MissingKeyCase{Arch::kQwen3Next, "expert_feed_forward_length"},
        MissingKeyCase{Arch::kQwen35, "feed_forward_length"}),
    [](const auto& p) {
      std::string name = std::string(arch_name(p.param.arch)) + "_" + p.param.key;
      for (char& c : name) {
        if (c == '.') c = '_';
      }
      return name;
    });

// A metadata edit and the key the resulting error must name.
struct BadValueCase {
  const char* name;
  Arch arch;
  std::vector<std::pair<std::string, GgufValue>> edits;  // keys without the arch prefix
  std::string key;                                       // without the arch prefix
};

class HparamsBadValueTest : public ::testing::TestWithParam<BadValueCase> {};

TEST_P(HparamsBadValueTest, NamesTheKey) {
  const BadValueCase& c = GetParam();
  const ModelHparams hp = test::tiny_hparams(c.arch);
  Metadata md = test::hparams_metadata(hp);
  const std::string prefix = std::string(arch_name(hp.arch)) + ".";
  for (const auto& [key, value] : c.edits) test::set_key(md, prefix + key, value);
  auto got = read_hparams(md, hp);
  ASSERT_FALSE(got) << c.name;
  EXPECT_EQ(got.error().code, ErrorCode::kInvalidArgument) << got.error().message;
  EXPECT_NE(got.error().message.find(prefix + c.key), std::string::npos)
      << "expected '" << prefix + c.key << "' in: " << got.error().message;
}

std::vector<BadValueCase> bad_value_cases() {
  using V = GgufValue;
  const Arch moe = Arch::kQwen35Moe;
  return {
      {"block_count_string", moe, {{"block_count", V::string("4")}}, "block_count"},
      {"block_count_float", moe, {{"block_count", V::f32(4.0f)}}, "block_count"},
      {"embedding_length_negative", moe, {{"embedding_length", V::i32(-64)}}, "embedding_length"},
      {"context_length_too_big", moe, {{"context_length", V::u64(uint64_t{1} << 40)}}, "context_length"},
      {"rms_eps_integer", moe, {{"attention.layer_norm_rms_epsilon", V::u32(1)}}, "attention.layer_norm_rms_epsilon"},
      {"rms_eps_zero", moe, {{"attention.layer_norm_rms_epsilon", V::f32(0.0f)}}, "attention.layer_norm_rms_epsilon"},
      {"freq_base_string", moe, {{"rope.freq_base", V::string("1e7")}}, "rope.freq_base"},
      {"sections_strings", moe, {{"rope.dimension_sections", V::string_array({"11"})}}, "rope.dimension_sections"},
      {"sections_negative", moe, {{"rope.dimension_sections", V::i32_array({2, -1, 1, 0})}}, "rope.dimension_sections"},
      {"sections_too_many",
       moe,
       {{"rope.dimension_sections", V::i32_array({1, 1, 1, 1, 0})}},
       "rope.dimension_sections"},
      {"key_ne_value_length", moe, {{"attention.value_length", V::u32(32)}}, "attention.key_length"},
      {"dk_ne_dv", moe, {{"ssm.state_size", V::u32(16)}}, "ssm.state_size"},
      {"inner_not_multiple_of_vh", moe, {{"ssm.inner_size", V::u32(30)}}, "ssm.inner_size"},
      {"vh_not_multiple_of_kh", moe, {{"ssm.group_count", V::u32(3)}}, "ssm.group_count"},
      {"vh_zero", moe, {{"ssm.time_step_rank", V::u32(0)}}, "ssm.time_step_rank"},
      {"heads_not_multiple_of_kv", moe, {{"attention.head_count_kv", V::u32(3)}}, "attention.head_count_kv"},
      {"kv_heads_zero", moe, {{"attention.head_count_kv", V::u32(0)}}, "attention.head_count_kv"},
      {"rope_dims_over_head_dim", moe, {{"rope.dimension_count", V::u32(32)}}, "rope.dimension_count"},
      {"rope_dims_odd", moe, {{"rope.dimension_count", V::u32(7)}}, "rope.dimension_count"},
      {"expert_count_zero", moe, {{"expert_count", V::u32(0)}}, "expert_count"},
      {"expert_used_zero", moe, {{"expert_used_count", V::u32(0)}}, "expert_used_count"},
      {"expert_used_over_count", Arch::kQwen3Next, {{"expert_used_count", V::u32(5)}}, "expert_used_count"},
      {"expert_ff_zero", moe, {{"expert_feed_forward_length", V::u32(0)}}, "expert_feed_forward_length"},
      {"dense_ff_zero", Arch::kQwen35, {{"feed_forward_length", V::u32(0)}}, "feed_forward_length"},
      {"nextn_all_blocks", moe, {{"nextn_predict_layers", V::u32(4)}}, "nextn_predict_layers"},
      {"interval_zero", moe, {{"full_attention_interval", V::u32(0)}}, "full_attention_interval"},
      {"vocab_size_mismatch", moe, {{"vocab_size", V::u32(97)}}, "vocab_size"},
  };
}

INSTANTIATE_TEST_SUITE_P(Rules, HparamsBadValueTest, ::testing::ValuesIn(bad_value_cases()),
                         [](const auto& p) { return std::string(p.param.name); });

TEST(ModelHparams, ValidateChecksAStructDirectly) {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  EXPECT_TRUE(hp.validate());
  hp.layer_kinds.pop_back();
  auto s = hp.validate();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("qwen35moe."), std::string::npos) << s.error().message;

  hp = test::tiny_hparams(Arch::kQwen35);
  hp.n_expert = 4;
  s = hp.validate();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("qwen35.expert_count"), std::string::npos) << s.error().message;

  hp = test::tiny_hparams(Arch::kQwen3Next);
  hp.n_block = 5;  // n_block != n_layer + n_nextn
  s = hp.validate();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("qwen3next.block_count"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace kestrel
