// Reference gated full-attention layer (model-spec.md §4, §8).
//
// For n_tok consecutive tokens at positions pos0 … pos0+n_tok−1 of one sequence (x already normed by attn_norm):
//   qg = W_q x   per head h: q_h = qg[h·2hd, h·2hd+hd), gate_h = qg[h·2hd+hd, (h+1)·2hd)   ([q|gate] per head)
//   k = W_k x, v = W_v x                                          [n_kv · hd] each
//   q_h = rms_norm(q_h) · q_norm, k_j = rms_norm(k_j) · k_norm    over all hd dims, eps (+1 baked in GGUF)
//   RoPE (rope.h) on dims [0, n_rot) of q_h and k_j at the token's position
//   append k (normed, roped) and raw v to the cache
//   attn_h = Σ_p softmax_p(q_h · K_p,kv(h) · 1/sqrt(hd)) V_p,kv(h) over cache slots p <= the token's own slot
//   kv(h) = h / (n_head / n_kv)   (grouped, HF repeat_kv)
//   out = W_o · concat_h(attn_h ⊙ sigmoid(gate_h))
// Prefill (n_tok > 1) is causal within the batch and gives bit-identical results to n_tok single-token calls.
// Scores are f32 dot products times the f32 scale; softmax subtracts the max and divides by the sum (activations.h).
#pragma once

#include <cstdint>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"
#include "core/reference/kv_cache.h"
#include "core/reference/matvec.h"

namespace kestrel::ref {

struct AttnDims {
  int n_embd = 0;     // H
  int n_head = 0;     // query heads
  int n_head_kv = 0;  // key/value heads; n_head is a multiple
  int head_dim = 0;   // hd (key_length == value_length)
  int n_rot = 0;      // rope.dimension_count, even, <= head_dim
  float freq_base = 10000.0f;
  float eps = 1e-6f;  // q/k norm eps (rms_norm_eps)

  Status validate() const;

  // The attention sizes of a model (head counts, key_length, rope.dimension_count and freq_base, rms_norm_eps).
  static AttnDims from_hparams(const ModelHparams& hp);
};

// Non-owning views of one attention layer's weights. Shapes in ggml order {n_in, n_out}.
struct AttnWeights {
  AttnDims dims;
  QuantMatrix q;                  // attn_q.weight      {H, n_head·2·hd}
  QuantMatrix k;                  // attn_k.weight      {H, n_kv·hd}
  QuantMatrix v;                  // attn_v.weight      {H, n_kv·hd}
  QuantMatrix o;                  // attn_output.weight {n_head·hd, H}
  const float* q_norm = nullptr;  // attn_q_norm.weight f32 [hd]
  const float* k_norm = nullptr;  // attn_k_norm.weight f32 [hd]
};

Status attn_check_weights(const AttnWeights& w);

// Causal softmax attention of one query head over cache slots [0, n_pos) of kv head `kv_head`.
// q: f32 [hd] (normed and roped); out: f32 [hd]. n_pos >= 1.
void attend_head(const KvCache& cache, int kv_head, int n_pos, const float* q, float scale, float* out);

// The whole layer. x: f32 [n_tok, H]; out: f32 [n_tok, H] (may not alias x). pos0 must equal cache.n_used (positions
// are cache slots); the cache must have room for n_tok more tokens and the layer's n_kv/hd (checked before anything
// is written, so on error the cache is unchanged). Thread-safe for distinct caches; weights are only read.
Status attn_forward(const AttnWeights& w, KvCache& cache, const float* x, int n_tok, int64_t pos0, float* out);

}  // namespace kestrel::ref
