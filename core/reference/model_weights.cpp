#include "core/reference/model_weights.h"

#include <string>

namespace kestrel::ref {
namespace {

// 1-D tensors the catalog guarantees to be F32 (norms, ssm_a, dt bias, conv1d); nullptr when absent.
const float* f32_data(const TensorRef& t) {
  if (!t.present() || t.type() != GgmlType::kF32) return nullptr;
  return reinterpret_cast<const float*>(t.data.data());  // GGUF tensor data is >= 32-byte aligned in the mapping
}

QuantExperts quant_experts(const TensorRef& t) {
  if (!t.present()) return {};
  return QuantExperts{t.type(), t.data.data(), t.ne_at(0), t.ne_at(1), t.ne_at(2)};
}

GdnWeights gdn_views(const ModelHparams& hp, const LayoutOptions& layout, const kestrel::GdnWeights& w) {
  GdnWeights g;
  g.dims = GdnDims::from_hparams(hp);
  g.projection = gdn_projection_for(hp.arch, layout.gdn_input);
  g.qkv = quant_matrix(w.qkv);
  g.gate = quant_matrix(w.gate);
  g.beta = quant_matrix(w.beta);
  g.alpha = quant_matrix(w.alpha);
  g.ba = quant_matrix(w.ba);
  g.ssm_in = quant_matrix(w.ssm_in);
  g.conv1d = f32_data(w.conv1d);
  g.dt_bias = f32_data(w.dt_bias);
  g.ssm_a = f32_data(w.a);
  g.ssm_norm = f32_data(w.norm);
  g.ssm_out = quant_matrix(w.out);
  return g;
}

AttnWeights attn_views(const ModelHparams& hp, const AttentionWeights& w) {
  AttnWeights a;
  a.dims = AttnDims::from_hparams(hp);
  a.q = quant_matrix(w.q);
  a.k = quant_matrix(w.k);
  a.v = quant_matrix(w.v);
  a.o = quant_matrix(w.o);
  a.q_norm = f32_data(w.q_norm);
  a.k_norm = f32_data(w.k_norm);
  return a;
}

MoeWeights moe_views(const ModelHparams& hp, const FfnWeights& w) {
  MoeWeights m;
  m.n_expert_used = static_cast<int>(hp.n_expert_used);
  m.router = quant_matrix(w.router);
  m.gate_exps = quant_experts(w.gate_exps);
  m.up_exps = quant_experts(w.up_exps);
  m.down_exps = quant_experts(w.down_exps);
  if (w.has_shared_expert()) {
    // ffn_gate_inp_shexp is {H} or {H, 1}: one output row of H inputs either way.
    m.shared_gate_inp = QuantMatrix{w.shared_gate_inp.type(), w.shared_gate_inp.data.data(), hp.n_embd, 1};
    m.gate_shexp = quant_matrix(w.gate_shexp);
    m.up_shexp = quant_matrix(w.up_shexp);
    m.down_shexp = quant_matrix(w.down_shexp);
  }
  return m;
}

Status check_f32(const float* p, const std::string& what) {
  if (p == nullptr) return make_error(ErrorCode::kInvalidArgument, what + " is missing or not F32");
  return ok_status();
}

}  // namespace

QuantMatrix quant_matrix(const TensorRef& t) {
  if (!t.present()) return {};
  return QuantMatrix{t.type(), t.data.data(), t.ne_at(0), t.ne_at(1)};
}

Expected<RefModelWeights> RefModelWeights::from_catalog(const WeightCatalog& catalog) {
  RefModelWeights m;
  m.hp = catalog.hparams();
  const GlobalWeights& g = catalog.globals();
  m.token_embd = quant_matrix(g.token_embd);
  m.output = quant_matrix(g.output);
  m.output_norm = f32_data(g.output_norm);
  KESTREL_TRY(check_f32(m.output_norm, "output_norm.weight"));
  KESTREL_TRY(check_matrix(m.token_embd, "token_embd.weight", m.hp.n_embd, m.hp.n_vocab));
  KESTREL_TRY(check_matrix(m.output, "output.weight", m.hp.n_embd, m.hp.n_vocab));

  m.layers.reserve(catalog.layers().size());
  for (const LayerWeights& lw : catalog.layers()) {
    const std::string prefix = "blk." + std::to_string(lw.index) + ".";
    RefLayerWeights l;
    l.kind = lw.kind;
    l.attn_norm = f32_data(lw.attn_norm);
    l.post_attention_norm = f32_data(lw.post_attention_norm);
    KESTREL_TRY(check_f32(l.attn_norm, prefix + "attn_norm.weight"));
    KESTREL_TRY(check_f32(l.post_attention_norm, prefix + "post_attention_norm.weight"));
    if (lw.kind == LayerKind::kGatedDeltaNet) {
      l.gdn = gdn_views(m.hp, catalog.layout(), lw.gdn);
      KESTREL_TRY(gdn_check_weights(l.gdn));
    } else {
      l.attn = attn_views(m.hp, lw.attn);
      KESTREL_TRY(attn_check_weights(l.attn));
    }
    l.is_moe = lw.ffn.is_moe();
    if (l.is_moe) {
      l.moe = moe_views(m.hp, lw.ffn);
      KESTREL_TRY(moe_check_weights(l.moe));
    } else {
      l.dense = DenseFfnWeights{quant_matrix(lw.ffn.gate), quant_matrix(lw.ffn.up), quant_matrix(lw.ffn.down)};
      KESTREL_TRY(swiglu_check(l.dense.gate, l.dense.up, l.dense.down, (prefix + "ffn").c_str()));
    }
    m.layers.push_back(std::move(l));
  }
  return m;
}

}  // namespace kestrel::ref
