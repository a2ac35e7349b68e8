// The bytes one decode step of an engine reads, for benchmarks' rooflines (docs/benchmarking.md): every weight but
// the routed experts and the embedding table (B rows of it are read), plus the routed experts B tokens touch per MoE
// layer if routing were uniform (E·(1 − (1 − k/E)^B) distinct experts), plus each session's f32 GDN state read and
// written and its f32 KV cache read up to position `pos`. Header-only, core types only, so CUDA and CPU benchmarks
// share it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
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

// The multiply-adds a prompt pass over n_tok tokens at positions from pos does with its weights and attention: every
// matrix (2-D tensor) but the routed experts, the embedding table and lm_head once per token, n_expert_used of a
// layer's routed experts per token, lm_head for the last token only (a prompt pass computes the logits of its last
// token), and causal attention's Q·K and P·V over positions up to pos + t per token t. The GDN recurrence's own
// products are left out (they are not weight products).
inline double prompt_pass_macs(const Model& m, int n_tok, int pos = 0) {
  const WeightCatalog& c = m.catalog();
  const ModelHparams& hp = m.hparams();
  const std::string& embd = c.globals().token_embd.name();
  const std::string lm_head = c.globals().tied_output ? embd : c.globals().output.name();
  double per_token = 0, routed = 0, lm = 0;
  for (const CatalogEntry& e : c.entries()) {
    if (e.skipped || e.info->ne.size() < 2 || e.info->ne[1] < 2) continue;
    const double elems = static_cast<double>(e.info->n_elements);
    if (e.info->name == lm_head) {
      lm = elems;
    } else if (e.info->name == embd) {
      continue;
    } else if (e.placement == PlacementClass::kRoutedExperts) {
      routed += elems;
    } else {
      per_token += elems;
    }
  }
  if (hp.is_moe()) per_token += routed * hp.n_expert_used / hp.n_expert;
  // Token t attends to pos + t + 1 positions: Q·K and P·V, head_dim each, per query head.
  const double positions = static_cast<double>(n_tok) * pos + 0.5 * n_tok * (n_tok + 1.0);
  const double attn = 2.0 * hp.n_head * hp.head_dim * positions * hp.n_attn_layers();
  return per_token * n_tok + lm + attn;
}

}  // namespace kestrel::bench
