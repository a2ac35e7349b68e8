// The bytes one decode step of an engine reads, for benchmarks' rooflines (docs/benchmarking.md): every weight but
// the routed experts and the embedding table (B rows of it are read), plus the routed experts B tokens touch per MoE
// layer if routing were uniform (E·(1 − (1 − k/E)^B) distinct experts), plus each session's f32 GDN state read and
// written and its f32 KV cache read up to position `pos`. Header-only, core types only, so CUDA and CPU benchmarks
// share it.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/model/model.h"

namespace kestrel::bench {

// Every weight but the routed experts and the embedding table, plus the routed experts n_tok tokens touch.
inline double weight_bytes_read(const Model& m, int n_tok) {
  const WeightCatalog& c = m.catalog();
  const ModelHparams& hp = m.hparams();
  const double routed = static_cast<double>(c.bytes_in(PlacementClass::kRoutedExperts));
  double bytes = static_cast<double>(c.total_bytes()) - routed;
  if (!c.globals().tied_output) bytes -= static_cast<double>(c.globals().token_embd.n_bytes());
  if (hp.is_moe()) {
    uint32_t moe_layers = 0;
    for (const LayerWeights& l : c.layers()) moe_layers += l.ffn.is_moe() ? 1 : 0;
    const double E = hp.n_expert, k = hp.n_expert_used;
    const double per_expert = routed / (moe_layers * E);
    bytes += moe_layers * E * (1.0 - std::pow(1.0 - k / E, n_tok)) * per_expert;
  }
  return bytes;
}

// One session's f32 state read and written once, all layers: the GDN state and conv history, and the KV cache up to
// position pos (read).
inline double session_state_bytes(const ModelHparams& hp, int pos) {
  const double gdn_state = (double(hp.ssm_n_v_heads) * hp.ssm_d_state * hp.ssm_head_v_dim() +
                            double(hp.ssm_conv_dim()) * (hp.ssm_conv_kernel - 1)) *
                           4.0;
  const double kv = 2.0 * hp.n_head_kv * hp.head_dim * 4.0 * pos;
  return 2.0 * gdn_state * hp.n_gdn_layers() + kv * hp.n_attn_layers();
}

inline double decode_step_bytes(const Model& m, int B, int pos) {
  return weight_bytes_read(m, B) + B * session_state_bytes(m.hparams(), pos);
}

// The bytes a prompt pass over n_tok consecutive tokens of one session at positions from pos reads at least: the
// weights as above with n_tok tokens, the session's state once (an engine that runs a prompt's tokens as one run
// keeps the GDN state on chip between them) and its KV cache up to pos.
inline double prompt_pass_bytes(const Model& m, int n_tok, int pos = 0) {
  return weight_bytes_read(m, n_tok) + session_state_bytes(m.hparams(), pos);
}

// decode_step_bytes split by where the weights live when only the routed experts marked in expert_on_gpu
// ([n_layer][n_expert], PlacementDecision::expert_on_gpu; empty: all) are on the GPU: the host reads the touched host
// experts (uniform routing: each expert is touched by B tokens with probability 1 − (1 − k/E)^B), the GPU the rest.
struct StepBytes {
  double gpu = 0;
  double host = 0;
};
inline StepBytes decode_step_split(const Model& m, int B, int pos, const std::vector<std::vector<uint8_t>>& on_gpu) {
  StepBytes s;
  s.gpu = decode_step_bytes(m, B, pos);
  const WeightCatalog& c = m.catalog();
  const ModelHparams& hp = m.hparams();
  if (!hp.is_moe() || on_gpu.empty()) return s;
  uint32_t moe_layers = 0;
  for (const LayerWeights& l : c.layers()) moe_layers += l.ffn.is_moe() ? 1 : 0;
  const double E = hp.n_expert, k = hp.n_expert_used;
  const double per_expert = static_cast<double>(c.bytes_in(PlacementClass::kRoutedExperts)) / (moe_layers * E);
  const double touched = 1.0 - std::pow(1.0 - k / E, B);
  for (const std::vector<uint8_t>& row : on_gpu) {
    for (uint8_t g : row) s.host += g == 0 ? touched * per_expert : 0.0;
  }
  s.gpu -= s.host;
  return s;
}

}  // namespace kestrel::bench
