// expected_tensors(): the tensor list of a qwen35moe / qwen35 / qwen3next GGUF (model-spec §6.2), in the order
// llama.cpp's converter writes them: token_embd, then per block attn_norm, the GDN or attention tensors,
// post_attention_norm and the FFN tensors, then output_norm and output. MTP blocks are not listed (Kestrel skips them
// and kestrel-mkmodel does not write them).
#include "core/model/tensor_layout.h"

#include <string>
#include <utility>

namespace kestrel {

std::string_view placement_class_name(PlacementClass c) {
  switch (c) {
    case PlacementClass::kEmbedding: return "embedding";
    case PlacementClass::kDense: return "dense";
    case PlacementClass::kRoutedExperts: return "routed-experts";
    case PlacementClass::kSharedExpert: return "shared-expert";
  }
  return "unknown";
}

namespace {

// Appends tensors of one block (or the globals when layer == -1) with a common name prefix.
class TensorListBuilder {
 public:
  explicit TensorListBuilder(std::vector<TensorSpec>* out) : out_(out) {}

  void set_layer(int32_t layer) {
    layer_ = layer;
    prefix_ = layer < 0 ? std::string() : "blk." + std::to_string(layer) + ".";
  }

  // A weight that real files quantize (2-D or 3-D projection).
  void weight(std::string_view name, std::vector<uint64_t> ne, PlacementClass placement) {
    add(name, std::move(ne), placement, /*quantizable=*/true, /*optional=*/false);
  }
  // A tensor that real files keep in F32 (norms, ssm_a, dt bias, conv taps, router).
  void f32(std::string_view name, std::vector<uint64_t> ne, PlacementClass placement) {
    add(name, std::move(ne), placement, /*quantizable=*/false, /*optional=*/false);
  }
  void optional_weight(std::string_view name, std::vector<uint64_t> ne, PlacementClass placement) {
    add(name, std::move(ne), placement, /*quantizable=*/true, /*optional=*/true);
  }

 private:
  void add(std::string_view name, std::vector<uint64_t> ne, PlacementClass placement, bool quantizable, bool optional) {
    TensorSpec spec;
    spec.name = prefix_ + std::string(name);
    spec.ne = std::move(ne);
    spec.layer = layer_;
    spec.placement = placement;
    spec.optional = optional;
    spec.quantizable = quantizable;
    out_->push_back(std::move(spec));
  }

  std::vector<TensorSpec>* out_;
  int32_t layer_ = -1;
  std::string prefix_;
};

void add_gdn_block(const ModelHparams& hp, const LayoutOptions& options, TensorListBuilder& b) {
  constexpr PlacementClass kD = PlacementClass::kDense;
  const uint64_t h = hp.n_embd;
  const uint64_t key_dim = hp.ssm_key_dim();    // Kh * dk
  const uint64_t value_dim = hp.ssm_inner;      // Vh * dv
  const uint64_t n_v_heads = hp.ssm_n_v_heads;  // Vh
  const bool legacy = hp.arch == Arch::kQwen3Next && options.gdn_input == GdnInputLayout::kLegacySsmIn;

  if (legacy) {
    b.weight("ssm_in.weight", {h, 2 * key_dim + 2 * value_dim}, kD);  // HF in_proj_qkvz, per-K-group [q,k,v,z]
    b.weight("ssm_ba.weight", {h, 2 * n_v_heads}, kD);
  } else {
    b.weight("attn_qkv.weight", {h, 2 * key_dim + value_dim}, kD);  // rows [Q | K | V]
    b.weight("attn_gate.weight", {h, value_dim}, kD);               // z
    if (hp.arch == Arch::kQwen3Next) {
      b.weight("ssm_ba.weight", {h, 2 * n_v_heads}, kD);
    } else {
      b.weight("ssm_beta.weight", {h, n_v_heads}, kD);
      b.weight("ssm_alpha.weight", {h, n_v_heads}, kD);
    }
  }
  b.f32("ssm_conv1d.weight", {hp.ssm_conv_kernel, hp.ssm_conv_dim()}, kD);
  b.f32("ssm_dt.bias", {n_v_heads}, kD);
  b.f32("ssm_a", {n_v_heads}, kD);
  b.f32("ssm_norm.weight", {hp.ssm_head_v_dim()}, kD);
  b.weight("ssm_out.weight", {value_dim, h}, kD);
}

void add_attention_block(const ModelHparams& hp, TensorListBuilder& b) {
  constexpr PlacementClass kD = PlacementClass::kDense;
  const uint64_t h = hp.n_embd;
  const uint64_t hd = hp.head_dim;
  b.weight("attn_q.weight", {h, uint64_t{hp.n_head} * 2 * hd}, kD);  // per head [q | gate]
  b.weight("attn_k.weight", {h, uint64_t{hp.n_head_kv} * hd}, kD);
  b.weight("attn_v.weight", {h, uint64_t{hp.n_head_kv} * hd}, kD);
  b.f32("attn_q_norm.weight", {hd}, kD);
  b.f32("attn_k_norm.weight", {hd}, kD);
  b.weight("attn_output.weight", {uint64_t{hp.n_head} * hd, h}, kD);
}

void add_ffn(const ModelHparams& hp, TensorListBuilder& b) {
  const uint64_t h = hp.n_embd;
  if (!hp.is_moe()) {
    constexpr PlacementClass kD = PlacementClass::kDense;
    b.weight("ffn_gate.weight", {h, hp.n_ff_dense}, kD);
    b.weight("ffn_up.weight", {h, hp.n_ff_dense}, kD);
    b.weight("ffn_down.weight", {hp.n_ff_dense, h}, kD);
    return;
  }
  constexpr PlacementClass kE = PlacementClass::kRoutedExperts;
  constexpr PlacementClass kS = PlacementClass::kSharedExpert;
  const uint64_t n_exp = hp.n_expert;
  const uint64_t ff_e = hp.n_ff_expert;
  b.f32("ffn_gate_inp.weight", {h, n_exp}, PlacementClass::kDense);  // router
  b.weight("ffn_gate_exps.weight", {h, ff_e, n_exp}, kE);
  b.weight("ffn_up_exps.weight", {h, ff_e, n_exp}, kE);
  b.weight("ffn_down_exps.weight", {ff_e, h, n_exp}, kE);
  if (hp.n_ff_shared > 0) {
    const uint64_t ff_s = hp.n_ff_shared;
    b.f32("ffn_gate_inp_shexp.weight", {h}, kS);  // scalar gate per token
    b.weight("ffn_gate_shexp.weight", {h, ff_s}, kS);
    b.weight("ffn_up_shexp.weight", {h, ff_s}, kS);
    b.weight("ffn_down_shexp.weight", {ff_s, h}, kS);
  }
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelHparams& hp, const LayoutOptions& options) {
  std::vector<TensorSpec> out;
  TensorListBuilder b(&out);
  const uint64_t h = hp.n_embd;

  b.set_layer(-1);
  b.weight("token_embd.weight", {h, hp.n_vocab}, PlacementClass::kEmbedding);

  for (uint32_t il = 0; il < hp.n_layer && il < hp.layer_kinds.size(); ++il) {
    b.set_layer(static_cast<int32_t>(il));
    b.f32("attn_norm.weight", {h}, PlacementClass::kDense);
    if (hp.layer_kinds[il] == LayerKind::kGatedDeltaNet) {
      add_gdn_block(hp, options, b);
    } else {
      add_attention_block(hp, b);
    }
    b.f32("post_attention_norm.weight", {h}, PlacementClass::kDense);
    add_ffn(hp, b);
  }

  b.set_layer(-1);
  b.f32("output_norm.weight", {h}, PlacementClass::kEmbedding);
  if (!options.tied_output) {
    b.optional_weight("output.weight", {h, hp.n_vocab}, PlacementClass::kEmbedding);
  }
  return out;
}

}  // namespace kestrel
