// Test helpers for core/model and the CLI (see model_test_util.h).
#include "tests/core/model/model_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/gguf/gguf_writer.h"

namespace kestrel::test {

ModelHparams tiny_hparams(Arch arch) {
  ModelHparams hp;
  hp.arch = arch;
  hp.n_block = 4;
  hp.n_layer = 4;
  hp.n_nextn = 0;
  hp.n_embd = 64;
  hp.n_vocab = 96;
  hp.n_ctx_train = 256;
  hp.n_head = 4;
  hp.n_head_kv = 2;
  hp.head_dim = 16;
  hp.n_rot = 8;
  hp.rope_freq_base = 1e7f;
  if (arch != Arch::kQwen3Next) hp.rope_sections = {2, 1, 1, 0};
  hp.rms_eps = 1e-6f;
  hp.ssm_conv_kernel = 4;
  hp.ssm_d_state = 8;
  hp.ssm_n_k_heads = 2;
  if (arch == Arch::kQwen35) {
    hp.ssm_n_v_heads = 6;  // r = 3, as Qwen3.5-27B
    hp.n_ff_dense = 48;
  } else {
    hp.ssm_n_v_heads = 4;  // r = 2
    hp.n_expert = 4;
    hp.n_expert_used = 2;
    hp.n_ff_expert = 16;
    hp.n_ff_shared = 32;
  }
  hp.ssm_inner = hp.ssm_n_v_heads * hp.ssm_d_state;
  hp.layer_kinds = {LayerKind::kGatedDeltaNet, LayerKind::kGatedDeltaNet, LayerKind::kGatedDeltaNet,
                    LayerKind::kFullAttention};
  return hp;
}

Metadata hparams_metadata(const ModelHparams& hp) {
  const std::string a(arch_name(hp.arch));
  Metadata md;
  md.emplace_back("general.architecture", GgufValue::string(a));
  md.emplace_back("general.name", GgufValue::string("kestrel test " + a));
  auto u32 = [&](std::string_view key, uint32_t v) { md.emplace_back(a + "." + std::string(key), GgufValue::u32(v)); };
  auto f32 = [&](std::string_view key, float v) { md.emplace_back(a + "." + std::string(key), GgufValue::f32(v)); };
  u32("block_count", hp.n_block);
  u32("context_length", hp.n_ctx_train);
  u32("embedding_length", hp.n_embd);
  if (hp.n_ff_dense > 0) u32("feed_forward_length", hp.n_ff_dense);
  u32("attention.head_count", hp.n_head);
  u32("attention.head_count_kv", hp.n_head_kv);
  u32("attention.key_length", hp.head_dim);
  u32("attention.value_length", hp.head_dim);
  f32("attention.layer_norm_rms_epsilon", hp.rms_eps);
  f32("rope.freq_base", hp.rope_freq_base);
  u32("rope.dimension_count", hp.n_rot);
  if (!hp.rope_sections.empty()) {
    md.emplace_back(a + ".rope.dimension_sections", GgufValue::i32_array(hp.rope_sections));
  }
  if (hp.n_expert > 0) {
    u32("expert_count", hp.n_expert);
    u32("expert_used_count", hp.n_expert_used);
    u32("expert_feed_forward_length", hp.n_ff_expert);
    if (hp.n_ff_shared > 0) u32("expert_shared_feed_forward_length", hp.n_ff_shared);
  }
  u32("ssm.conv_kernel", hp.ssm_conv_kernel);
  u32("ssm.state_size", hp.ssm_d_state);
  u32("ssm.group_count", hp.ssm_n_k_heads);
  u32("ssm.time_step_rank", hp.ssm_n_v_heads);
  u32("ssm.inner_size", hp.ssm_inner);
  u32("full_attention_interval", 4);
  if (hp.n_nextn > 0) u32("nextn_predict_layers", hp.n_nextn);
  return md;
}

bool erase_key(Metadata& md, std::string_view key) {
  auto it = std::find_if(md.begin(), md.end(), [&](const auto& kv) { return kv.first == key; });
  if (it == md.end()) return false;
  md.erase(it);
  return true;
}

void set_key(Metadata& md, std::string key, GgufValue value) {
  for (auto& kv : md) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  md.emplace_back(std::move(key), std::move(value));
}

std::vector<TensorDef> model_tensors(const ModelHparams& hp, const LayoutOptions& options) {
  std::vector<TensorDef> defs;
  for (const TensorSpec& s : expected_tensors(hp, options)) defs.push_back({s.name, s.ne, GgmlType::kF32});
  return defs;
}

TensorDef* find_def(std::vector<TensorDef>& defs, std::string_view name) {
  for (TensorDef& d : defs) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

bool erase_def(std::vector<TensorDef>& defs, std::string_view name) {
  auto it = std::find_if(defs.begin(), defs.end(), [&](const TensorDef& d) { return d.name == name; });
  if (it == defs.end()) return false;
  defs.erase(it);
  return true;
}

std::string write_gguf(std::string_view file_name, const Metadata& md, const std::vector<TensorDef>& tensors) {
  const std::string path = ::testing::TempDir() + std::string(file_name);
  auto w = GgufWriter::create(path);
  if (!w) {
    ADD_FAILURE() << w.error().to_string();
    return "";
  }
  auto check = [](const Status& s) {
    if (!s) ADD_FAILURE() << s.error().to_string();
    return static_cast<bool>(s);
  };
  for (const auto& [key, value] : md) {
    if (!check(w->add_metadata(key, value))) return "";
  }
  for (const TensorDef& t : tensors) {
    if (!check(w->add_tensor(t.name, t.ne, t.type))) return "";
  }
  if (!check(w->write_header())) return "";
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<uint8_t> bytes(w->tensors()[i].n_bytes, fill_byte(i));
    if (!check(w->write_tensor(tensors[i].name, bytes))) return "";
  }
  if (!check(w->finish())) return "";
  return path;
}

void expect_same_hparams(const ModelHparams& a, const ModelHparams& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_block, b.n_block);
  EXPECT_EQ(a.n_nextn, b.n_nextn);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_vocab, b.n_vocab);
  EXPECT_EQ(a.n_ctx_train, b.n_ctx_train);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_head_kv, b.n_head_kv);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_rot, b.n_rot);
  EXPECT_EQ(a.rope_freq_base, b.rope_freq_base);
  EXPECT_EQ(a.rope_sections, b.rope_sections);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.ssm_conv_kernel, b.ssm_conv_kernel);
  EXPECT_EQ(a.ssm_d_state, b.ssm_d_state);
  EXPECT_EQ(a.ssm_n_k_heads, b.ssm_n_k_heads);
  EXPECT_EQ(a.ssm_n_v_heads, b.ssm_n_v_heads);
  EXPECT_EQ(a.ssm_inner, b.ssm_inner);
  EXPECT_EQ(a.n_expert, b.n_expert);
  EXPECT_EQ(a.n_expert_used, b.n_expert_used);
  EXPECT_EQ(a.n_ff_expert, b.n_ff_expert);
  EXPECT_EQ(a.n_ff_shared, b.n_ff_shared);
  EXPECT_EQ(a.n_ff_dense, b.n_ff_dense);
  EXPECT_EQ(a.layer_kinds, b.layer_kinds);
}

}  // namespace kestrel::test
