// Tests of expected_tensors() through kestrel-mkmodel's presets, the Q4_K_M type rules and the --dry-run plan: the
// full-size presets' tensor lists and byte totals are checked against sizes computed here independently from
// model-spec §1 / §6.2 / §6.4 (and against the literal totals quoted in docs/mkmodel.md).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "core/model/tensor_layout.h"
#include "tools/mkmodel/model_plan.h"
#include "tools/mkmodel/presets.h"
#include "tools/mkmodel/tensor_types.h"
#include "tools/mkmodel/weight_init.h"

namespace kestrel::mkmodel {
namespace {

Preset preset(const std::string& name) {
  auto p = find_preset(name);
  EXPECT_TRUE(p.has_value()) << name;
  return p.has_value() ? *p : Preset{};
}

ModelPlan plan_of(const std::string& name, PlanOptions options = {}) {
  auto plan = make_model_plan(preset(name), options);
  EXPECT_TRUE(plan.has_value()) << (plan ? "" : plan.error().to_string());
  return plan.has_value() ? *plan : ModelPlan{};
}

const PlannedTensor* find(const ModelPlan& plan, const std::string& name) {
  for (const PlannedTensor& t : plan.tensors) {
    if (t.spec.name == name) return &t;
  }
  return nullptr;
}

// ---- Independent size arithmetic (bytes per 256 elements: Q4_K 144, Q5_K 176, Q6_K 210) ----
uint64_t q4k(uint64_t n) { return n / 256 * 144; }
uint64_t q5k(uint64_t n) { return n / 256 * 176; }
uint64_t q6k(uint64_t n) { return n / 256 * 210; }
uint64_t f32(uint64_t n) { return n * 4; }
bool more_bits(uint64_t i, uint64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

struct Shape {
  uint64_t h, vocab, layers, experts, ff_e, ff_s, ff_dense, n_head, n_kv, hd, kh, vh, dk;
  bool qwen3next;
};

// Tensor bytes of a Q4_K_M file of this shape (interval-4 layer pattern, untied output), from the rules in
// model-spec §6.4 written out directly.
uint64_t q4_k_m_bytes(const Shape& s) {
  const uint64_t key_dim = s.kh * s.dk, value_dim = s.vh * s.dk, conv_dim = 2 * key_dim + value_dim;
  uint64_t total = q4k(s.h * s.vocab) + f32(s.h) + q6k(s.h * s.vocab);
  uint64_t attn_index = 0;
  for (uint64_t l = 0; l < s.layers; ++l) {
    total += 2 * f32(s.h);  // attn_norm, post_attention_norm
    auto down = [&](uint64_t n) { return more_bits(l, s.layers) ? q6k(n) : q4k(n); };
    if (s.experts > 0) {
      total += f32(s.h * s.experts) + 2 * q4k(s.h * s.ff_e * s.experts) + down(s.ff_e * s.h * s.experts);
      total += f32(s.h) + 2 * q4k(s.h * s.ff_s) + down(s.ff_s * s.h);
    } else {
      total += 2 * q4k(s.h * s.ff_dense) + down(s.ff_dense * s.h);
    }
    if ((l + 1) % 4 != 0) {
      total += q5k(s.h * conv_dim) + q4k(s.h * value_dim);
      total += s.qwen3next ? q4k(s.h * 2 * s.vh) : 2 * q4k(s.h * s.vh);
      total += f32(4 * conv_dim) + 2 * f32(s.vh) + f32(s.dk) + q4k(value_dim * s.h);
    } else {
      const uint64_t kv = s.h * s.n_kv * s.hd;
      total += q4k(s.h * s.n_head * 2 * s.hd) + q4k(kv) + (more_bits(attn_index++, s.layers) ? q6k(kv) : q4k(kv));
      total += 2 * f32(s.hd) + q4k(s.n_head * s.hd * s.h);
    }
  }
  return total;
}

TEST(MkModelPlan, Qwen35Moe35bMatchesTheSpec) {
  const ModelPlan plan = plan_of("qwen35moe-35b-a3b");
  const ModelHparams& hp = plan.preset.hparams;
  EXPECT_EQ(hp.n_layer, 40u);
  EXPECT_EQ(hp.n_expert, 256u);
  EXPECT_EQ(hp.n_gdn_layers(), 30u);
  EXPECT_EQ(hp.n_attn_layers(), 10u);
  // token_embd + 30 GDN layers x 19 + 10 attention layers x 16 (each with 2 norms and 8 FFN tensors) + 2.
  EXPECT_EQ(plan.tensors.size(), 1u + 30 * 19 + 10 * 16 + 2);
  const Shape s{2048, 248320, 40, 256, 512, 512, 0, 16, 2, 256, 16, 32, 128, false};
  EXPECT_EQ(plan.tensor_bytes(), q4_k_m_bytes(s));
  EXPECT_EQ(plan.tensor_bytes(), 21158128128ull);  // docs/mkmodel.md
  EXPECT_EQ(plan.file_type, kFileTypeQ4KM);

  const PlannedTensor* exps = find(plan, "blk.0.ffn_down_exps.weight");
  ASSERT_NE(exps, nullptr);
  EXPECT_EQ(exps->spec.ne, (std::vector<uint64_t>{512, 2048, 256}));
  EXPECT_EQ(exps->type, GgmlType::kQ6_K);  // layer 0 < 40/8
  EXPECT_EQ(exps->spec.placement, PlacementClass::kRoutedExperts);
  EXPECT_EQ(find(plan, "blk.5.ffn_down_exps.weight")->type, GgmlType::kQ4_K);
  EXPECT_EQ(find(plan, "blk.7.ffn_down_exps.weight")->type, GgmlType::kQ6_K);  // (7 - 5) % 3 == 2
  EXPECT_EQ(find(plan, "blk.7.ffn_down_shexp.weight")->type, GgmlType::kQ6_K);
  EXPECT_EQ(find(plan, "blk.0.attn_qkv.weight")->type, GgmlType::kQ5_K);
  EXPECT_EQ(find(plan, "blk.0.attn_qkv.weight")->spec.ne, (std::vector<uint64_t>{2048, 8192}));
  EXPECT_EQ(find(plan, "blk.0.ssm_beta.weight")->spec.ne, (std::vector<uint64_t>{2048, 32}));
  EXPECT_EQ(find(plan, "blk.0.ssm_conv1d.weight")->type, GgmlType::kF32);
  EXPECT_EQ(find(plan, "blk.0.ffn_gate_inp.weight")->type, GgmlType::kF32);
  EXPECT_EQ(find(plan, "blk.3.attn_q.weight")->spec.ne, (std::vector<uint64_t>{2048, 8192}));
  EXPECT_EQ(find(plan, "blk.3.attn_output.weight")->spec.ne, (std::vector<uint64_t>{4096, 2048}));
  // attn_v: index among attention layers 0..9, n = 40 (attn_v + attn_qkv tensors): Q6_K for 0..4 and 7.
  std::set<int> q6_v;
  for (int a = 0; a < 10; ++a) {
    if (find(plan, "blk." + std::to_string(4 * a + 3) + ".attn_v.weight")->type == GgmlType::kQ6_K) q6_v.insert(a);
  }
  EXPECT_EQ(q6_v, (std::set<int>{0, 1, 2, 3, 4, 7}));
  EXPECT_EQ(find(plan, "token_embd.weight")->type, GgmlType::kQ4_K);
  EXPECT_EQ(find(plan, "output.weight")->type, GgmlType::kQ6_K);
  EXPECT_EQ(plan.tensors.front().spec.name, "token_embd.weight");
  EXPECT_EQ(plan.tensors.back().spec.name, "output.weight");
  // Expert tensors are > 64 MB: the writer streams them in chunks (model_writer.h).
  EXPECT_GT(exps->n_bytes, uint64_t{64} << 20);
}

// The 64-expert variant reads the same bytes per token: every tensor of the 35B-A3B plan, same type and shape, but
// the routed-expert stacks and the router with 64 experts instead of 256.
TEST(MkModelPlan, Qwen35Moe35bE64DiffersOnlyInTheExpertCount) {
  const ModelPlan full = plan_of("qwen35moe-35b-a3b");
  const ModelPlan e64 = plan_of("qwen35moe-35b-a3b-e64");
  EXPECT_EQ(e64.preset.hparams.n_expert, 64u);
  ASSERT_EQ(e64.tensors.size(), full.tensors.size());
  for (size_t i = 0; i < full.tensors.size(); ++i) {
    const PlannedTensor& a = full.tensors[i];
    const PlannedTensor& b = e64.tensors[i];
    ASSERT_EQ(a.spec.name, b.spec.name);
    EXPECT_EQ(a.type, b.type) << a.spec.name;
    std::vector<uint64_t> ne = a.spec.ne;
    if (a.spec.name.find("_exps.") != std::string::npos) ne[2] = 64;
    if (a.spec.name.find("ffn_gate_inp.") != std::string::npos) ne[1] = 64;
    EXPECT_EQ(b.spec.ne, ne) << a.spec.name;
  }
}
TEST(MkModelPlan, Qwen3Next80bMatchesTheSpec) {
  const ModelPlan plan = plan_of("qwen3next-80b-a3b");
  EXPECT_EQ(plan.preset.hparams.n_layer, 48u);
  EXPECT_EQ(plan.preset.hparams.n_expert, 512u);
  EXPECT_TRUE(plan.preset.hparams.rope_sections.empty());
  const Shape s{2048, 151936, 48, 512, 512, 512, 0, 16, 2, 256, 16, 32, 128, true};
  EXPECT_EQ(plan.tensor_bytes(), q4_k_m_bytes(s));
  EXPECT_EQ(plan.tensor_bytes(), 48481240064ull);  // docs/mkmodel.md
  EXPECT_NE(find(plan, "blk.0.ssm_ba.weight"), nullptr);
  EXPECT_EQ(find(plan, "blk.0.ssm_ba.weight")->spec.ne, (std::vector<uint64_t>{2048, 64}));
  EXPECT_EQ(find(plan, "blk.0.ssm_beta.weight"), nullptr);
  EXPECT_EQ(find(plan, "blk.0.ssm_in.weight"), nullptr);
}

TEST(MkModelPlan, Qwen35Dense27bMatchesTheSpec) {
  const ModelPlan plan = plan_of("qwen35-27b");
  const ModelHparams& hp = plan.preset.hparams;
  EXPECT_EQ(hp.n_layer, 64u);
  EXPECT_FALSE(hp.is_moe());
  const Shape s{5120, 248320, 64, 0, 0, 0, 17408, 24, 4, 256, 16, 48, 128, false};
  EXPECT_EQ(plan.tensor_bytes(), q4_k_m_bytes(s));
  EXPECT_EQ(plan.tensor_bytes(), 16529278976ull);  // docs/mkmodel.md
  EXPECT_EQ(find(plan, "blk.0.ffn_down.weight")->spec.ne, (std::vector<uint64_t>{17408, 5120}));
  EXPECT_EQ(find(plan, "blk.0.ssm_out.weight")->spec.ne, (std::vector<uint64_t>{6144, 5120}));
  EXPECT_EQ(find(plan, "blk.0.ssm_conv1d.weight")->spec.ne, (std::vector<uint64_t>{4, 10240}));
  EXPECT_EQ(find(plan, "blk.0.ffn_gate_inp.weight"), nullptr);
}

TEST(MkModelPlan, TinyPresetsKeepEveryStructuralFeature) {
  for (const std::string name : {"tiny", "tiny-qwen3next", "tiny-qwen35"}) {
    SCOPED_TRACE(name);
    const ModelPlan plan = plan_of(name);
    const ModelHparams& hp = plan.preset.hparams;
    EXPECT_TRUE(hp.validate().has_value());
    EXPECT_GT(hp.n_gdn_layers(), 0u);
    EXPECT_GT(hp.n_attn_layers(), 0u);
    EXPECT_LT(hp.ssm_n_k_heads, hp.ssm_n_v_heads);  // r > 1: grouped vs tiled mapping matters
    EXPECT_GT(hp.n_head, hp.n_head_kv);             // GQA
    EXPECT_GT(hp.head_dim, hp.n_rot);               // partial rotary
    EXPECT_EQ(hp.n_vocab, 151936u);
    if (hp.is_moe()) {
      EXPECT_GE(hp.n_expert, 16u);
      EXPECT_GT(hp.n_ff_shared, 0u);
    }
    EXPECT_LT(plan.tensor_bytes(), uint64_t{24} << 20);
    // Every tensor is written in a type Kestrel computes with; K-quants only where rows are multiples of 256.
    for (const PlannedTensor& t : plan.tensors) {
      const bool k = t.type == GgmlType::kQ4_K || t.type == GgmlType::kQ5_K || t.type == GgmlType::kQ6_K;
      if (k) {
        EXPECT_EQ(t.spec.ne[0] % 256, 0u) << t.spec.name;
      }
      if (!t.spec.quantizable) {
        EXPECT_EQ(t.type, GgmlType::kF32) << t.spec.name;
      }
    }
  }
  // The embedded default model ties its output to token_embd, which then takes the output's type (Q8_0 at H=64).
  const ModelPlan tiny = plan_of("tiny");
  EXPECT_EQ(find(tiny, "output.weight"), nullptr);
  EXPECT_EQ(find(tiny, "token_embd.weight")->type, GgmlType::kQ8_0);
  EXPECT_EQ(find(tiny, "blk.0.ssm_out.weight")->type, GgmlType::kQ4_K);  // {256, 64}
  EXPECT_EQ(find(tiny, "blk.0.ffn_down_shexp.weight")->type, GgmlType::kQ6_K);
  EXPECT_EQ(find(tiny, "blk.0.attn_qkv.weight")->type, GgmlType::kQ8_0);   // Q5_K fallback at 64-element rows
  EXPECT_EQ(find(tiny, "blk.0.attn_gate.weight")->type, GgmlType::kQ4_0);  // Q4_K fallback
  const ModelPlan next = plan_of("tiny-qwen3next");
  EXPECT_EQ(find(next, "token_embd.weight")->type, GgmlType::kQ4_0);
  EXPECT_EQ(find(next, "output.weight")->type, GgmlType::kQ8_0);
}

TEST(MkModelPlan, ExpectedTensorsOrderAndRoles) {
  const Preset p = preset("tiny");
  const std::vector<TensorSpec> specs = expected_tensors(p.hparams, p.layout);
  // Block 0 (GDN) and block 3 (attention) in converter order.
  std::vector<std::string> blk0;
  std::vector<std::string> blk3;
  for (const TensorSpec& s : specs) {
    if (s.layer == 0) blk0.push_back(s.name);
    if (s.layer == 3) blk3.push_back(s.name);
  }
  const std::vector<std::string> want0 = {"blk.0.attn_norm.weight",
                                          "blk.0.attn_qkv.weight",
                                          "blk.0.attn_gate.weight",
                                          "blk.0.ssm_beta.weight",
                                          "blk.0.ssm_alpha.weight",
                                          "blk.0.ssm_conv1d.weight",
                                          "blk.0.ssm_dt.bias",
                                          "blk.0.ssm_a",
                                          "blk.0.ssm_norm.weight",
                                          "blk.0.ssm_out.weight",
                                          "blk.0.post_attention_norm.weight",
                                          "blk.0.ffn_gate_inp.weight",
                                          "blk.0.ffn_gate_exps.weight",
                                          "blk.0.ffn_up_exps.weight",
                                          "blk.0.ffn_down_exps.weight",
                                          "blk.0.ffn_gate_inp_shexp.weight",
                                          "blk.0.ffn_gate_shexp.weight",
                                          "blk.0.ffn_up_shexp.weight",
                                          "blk.0.ffn_down_shexp.weight"};
  EXPECT_EQ(blk0, want0);
  const std::vector<std::string> want3_head = {"blk.3.attn_norm.weight",   "blk.3.attn_q.weight",
                                               "blk.3.attn_k.weight",      "blk.3.attn_v.weight",
                                               "blk.3.attn_q_norm.weight", "blk.3.attn_k_norm.weight",
                                               "blk.3.attn_output.weight", "blk.3.post_attention_norm.weight"};
  ASSERT_GE(blk3.size(), want3_head.size());
  EXPECT_EQ(std::vector<std::string>(blk3.begin(), blk3.begin() + 8), want3_head);

  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& s : specs) by_name[s.name] = &s;
  const ModelHparams& hp = p.hparams;
  EXPECT_EQ(by_name["blk.0.ffn_gate_exps.weight"]->ne, (std::vector<uint64_t>{hp.n_embd, hp.n_ff_expert, hp.n_expert}));
  EXPECT_EQ(by_name["blk.0.ffn_down_exps.weight"]->ne, (std::vector<uint64_t>{hp.n_ff_expert, hp.n_embd, hp.n_expert}));
  EXPECT_EQ(by_name["blk.0.ffn_gate_inp.weight"]->ne, (std::vector<uint64_t>{hp.n_embd, hp.n_expert}));
  EXPECT_EQ(by_name["blk.0.ffn_gate_inp_shexp.weight"]->ne, (std::vector<uint64_t>{hp.n_embd}));
  EXPECT_EQ(by_name["blk.0.ffn_down_shexp.weight"]->ne, (std::vector<uint64_t>{hp.n_ff_shared, hp.n_embd}));
  EXPECT_EQ(by_name["blk.0.ssm_norm.weight"]->ne, (std::vector<uint64_t>{hp.ssm_d_state}));
  EXPECT_EQ(by_name["blk.3.attn_q.weight"]->ne,
            (std::vector<uint64_t>{hp.n_embd, uint64_t{hp.n_head} * 2 * hp.head_dim}));
  EXPECT_FALSE(by_name["blk.0.ffn_gate_inp.weight"]->quantizable);
  EXPECT_FALSE(by_name["blk.0.ssm_conv1d.weight"]->quantizable);
  EXPECT_TRUE(by_name["blk.0.ssm_beta.weight"]->quantizable);
  EXPECT_EQ(by_name["blk.0.ffn_up_shexp.weight"]->placement, PlacementClass::kSharedExpert);
  EXPECT_EQ(by_name["blk.0.ffn_gate_inp_shexp.weight"]->placement, PlacementClass::kSharedExpert);
  EXPECT_EQ(by_name["blk.0.ffn_gate_inp.weight"]->placement, PlacementClass::kDense);
  EXPECT_EQ(by_name["token_embd.weight"]->placement, PlacementClass::kEmbedding);
  EXPECT_EQ(by_name["output_norm.weight"]->placement, PlacementClass::kEmbedding);
  EXPECT_EQ(by_name.count("output.weight"), 0u);  // tied

  LayoutOptions untied = p.layout;
  untied.tied_output = false;
  const std::vector<TensorSpec> with_output = expected_tensors(hp, untied);
  ASSERT_EQ(with_output.back().name, "output.weight");
  EXPECT_TRUE(with_output.back().optional);
}

TEST(MkModelPlan, LegacyGdnLayoutOnlyForQwen3Next) {
  PlanOptions legacy;
  legacy.gdn_input = GdnInputLayout::kLegacySsmIn;
  const ModelPlan plan = plan_of("tiny-qwen3next", legacy);
  const ModelHparams& hp = plan.preset.hparams;
  const PlannedTensor* ssm_in = find(plan, "blk.0.ssm_in.weight");
  ASSERT_NE(ssm_in, nullptr);
  EXPECT_EQ(ssm_in->spec.ne, (std::vector<uint64_t>{hp.n_embd, 2 * hp.ssm_key_dim() + 2ull * hp.ssm_inner}));
  EXPECT_NE(find(plan, "blk.0.ssm_ba.weight"), nullptr);
  EXPECT_EQ(find(plan, "blk.0.attn_qkv.weight"), nullptr);
  EXPECT_EQ(find(plan, "blk.0.attn_gate.weight"), nullptr);

  auto refused = make_model_plan(preset("tiny"), legacy);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message.find("qwen3next"), std::string::npos);
}

TEST(MkModelPlan, UniformTypes) {
  for (const std::string name : {"tiny", "tiny-qwen3next", "tiny-qwen35"}) {
    PlanOptions o;
    o.uniform_type = GgmlType::kQ4_0;
    const ModelPlan plan = plan_of(name, o);
    EXPECT_EQ(plan.file_type, 2u);
    for (const PlannedTensor& t : plan.tensors) {
      EXPECT_EQ(t.type, t.spec.quantizable ? GgmlType::kQ4_0 : GgmlType::kF32) << name << " " << t.spec.name;
    }
  }
  // A K-quant does not fit 64-element rows: refused, naming the first such tensor.
  PlanOptions k;
  k.uniform_type = GgmlType::kQ4_K;
  auto refused = make_model_plan(preset("tiny"), k);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("token_embd.weight"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("256"), std::string::npos);
  // ... but fits every full-size shape.
  EXPECT_TRUE(make_model_plan(preset("qwen35moe-35b-a3b"), k).has_value());

  PlanOptions unsupported;
  unsupported.uniform_type = GgmlType::kQ3_K;
  auto no = make_model_plan(preset("qwen35moe-35b-a3b"), unsupported);
  ASSERT_FALSE(no.has_value());
  EXPECT_EQ(no.error().code, ErrorCode::kUnsupported);
}

TEST(MkModelPlan, UseMoreBitsMatchesLlamaQuantize) {
  // llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2; for 40 layers: 0-4, 7, 10, ..., 34, 35-39.
  std::set<int> on;
  for (int i = 0; i < 40; ++i) {
    if (use_more_bits(i, 40)) on.insert(i);
  }
  EXPECT_EQ(on, (std::set<int>{0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 35, 36, 37, 38, 39}));
}

TEST(MkModelPlan, InitsByRole) {
  const ModelPlan plan = plan_of("qwen35moe-35b-a3b");
  const auto init = [&](const std::string& n) { return find(plan, n)->init; };
  EXPECT_EQ(init("blk.0.attn_norm.weight").kind, InitKind::kUniform);
  EXPECT_EQ(init("blk.0.ssm_norm.weight").kind, InitKind::kUniform);
  EXPECT_EQ(init("blk.0.ssm_a").kind, InitKind::kNegExp);
  EXPECT_FLOAT_EQ(init("blk.0.ffn_gate_inp.weight").std, 1.0f / std::sqrt(2048.0f));
  EXPECT_FLOAT_EQ(init("blk.0.ffn_up_exps.weight").std, 1.0f / std::sqrt(2048.0f));
  EXPECT_FLOAT_EQ(init("blk.0.ffn_down_exps.weight").std, 0.5f / std::sqrt(512.0f));
  EXPECT_FLOAT_EQ(init("blk.0.ssm_out.weight").std, 0.5f / std::sqrt(4096.0f));
  EXPECT_FLOAT_EQ(init("blk.0.ssm_conv1d.weight").std, 0.5f);
  const std::string text = format_plan(plan);
  EXPECT_NE(text.find("blk.39.ffn_down_exps.weight"), std::string::npos);
  EXPECT_NE(text.find("21158128128 tensor bytes"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::mkmodel
