// Reference Gated DeltaNet layer: projections, conv, gates, delta rule, gated norm, output projection
// (model-spec.md §3, whole section; §6.2 tensors; §6.3 converter transforms; §8 pitfalls).
//
// For each of n_tok consecutive tokens of one sequence (x already normed by attn_norm):
//   mixed_qkv, z, b, a  = input projections (layout per GdnProjection, §3.1)
//   u                   = silu(causal_conv(mixed_qkv))                        (gdn_conv.h, §3.3)
//   q̂, k̂, v; beta, g   = split/L2-norm/scale; gates                          (gdn_prepare.h, §3.2, §3.4)
//   o_h                 = delta rule with k̂/q̂ of K-head gdn_k_head(h)        (delta_rule.h, §3.5/§3.6)
//   n_h                 = rms_norm_gated(o_h, z_h, ssm_norm)                  (norm.h, §3.7)
//   out                 = ssm_out · concat_h n_h
// GdnMode::kRecurrent runs conv and delta rule token by token (decode; also valid for any n_tok);
// GdnMode::kChunked runs the prefill conv and the 64-token chunked delta rule over the whole batch. Both start from
// `state` (zero or not) and leave it as it is after the last token; they agree to f32 rounding.
#pragma once

#include "core/base/expected.h"
#include "core/model/model_hparams.h"
#include "core/model/tensor_layout.h"
#include "core/reference/gdn_state.h"
#include "core/reference/matvec.h"

namespace kestrel::ref {

// Which GGUF tensors feed mixed_qkv, z, b and a.
enum class GdnProjection {
  kQkvGateBetaAlpha,  // qwen35/qwen35moe: attn_qkv, attn_gate, ssm_beta, ssm_alpha
  kQkvGateBa,         // qwen3next:        attn_qkv, attn_gate, ssm_ba (per-K-group [b(r), a(r)])
  kSsmInBa,           // legacy qwen3next: ssm_in (HF in_proj_qkvz, per-K-group [q, k, v(r·dv), z(r·dv)]), ssm_ba
};

// The projection layout of a GGUF file: qwen35* → kQkvGateBetaAlpha; qwen3next → kQkvGateBa, or kSsmInBa when the
// file has the legacy ssm_in tensor.
GdnProjection gdn_projection_for(Arch arch, GdnInputLayout input);

enum class GdnMode { kRecurrent, kChunked };

// Non-owning views of one GDN layer's weights; unused roles stay empty. Shapes in ggml order {n_in, n_out}.
struct GdnWeights {
  GdnDims dims;
  GdnProjection projection = GdnProjection::kQkvGateBetaAlpha;
  QuantMatrix qkv;                  // attn_qkv.weight  {H, 2·key_dim + value_dim}, rows [Q | K | V]
  QuantMatrix gate;                 // attn_gate.weight {H, value_dim}, z
  QuantMatrix beta;                 // ssm_beta.weight  {H, Vh}
  QuantMatrix alpha;                // ssm_alpha.weight {H, Vh}
  QuantMatrix ba;                   // ssm_ba.weight    {H, 2·Vh}
  QuantMatrix ssm_in;               // ssm_in.weight    {H, 2·key_dim + 2·value_dim}
  const float* conv1d = nullptr;    // ssm_conv1d.weight f32 {K, C}: w[c][i] at c·K + i
  const float* dt_bias = nullptr;   // ssm_dt.bias f32 [Vh]
  const float* ssm_a = nullptr;     // ssm_a f32 [Vh], = −exp(A_log)
  const float* ssm_norm = nullptr;  // ssm_norm.weight f32 [dv] (no +1)
  QuantMatrix ssm_out;              // ssm_out.weight   {value_dim, H}
};

// Checks dims, that every role the projection needs is present with the right shape, and the f32 pointers.
// kInvalidArgument naming the tensor and both shapes.
Status gdn_check_weights(const GdnWeights& w);

// The input projections of n_tok tokens. x: f32 [n_tok, H]. Out: mixed_qkv f32 [n_tok, C] (raw, pre-conv),
// z f32 [n_tok, value_dim], b f32 [n_tok, Vh], a f32 [n_tok, Vh]. Weights must pass gdn_check_weights.
Status gdn_project(const GdnWeights& w, const float* x, int n_tok, float* mixed_qkv, float* z, float* b, float* a);

// The whole layer. x: f32 [n_tok, H] (normed input); out: f32 [n_tok, H] (may not alias x); state updated in place
// (must have been made for w.dims). n_tok >= 0. Errors: gdn_check_weights, state size, dequantization.
// Thread-safe for distinct states; the weights are only read.
Status gdn_forward(const GdnWeights& w, GdnState& state, const float* x, int n_tok, float* out, GdnMode mode);

}  // namespace kestrel::ref
