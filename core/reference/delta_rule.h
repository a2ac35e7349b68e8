// Reference gated delta rule for one V-head: the recurrent (decode) step and the chunked (prefill) form
// (model-spec.md §3.5, §3.6, §8).
//
// Inputs per token t: q̂_t (L2-normed and scaled by 1/sqrt(dk)), k̂_t (L2-normed), v_t, gate g_t <= 0, beta_t.
// State S: f32 [dk][dv] (S[i][j] at i·dv + j).
//
// Recurrent step (HF torch_recurrent_gated_delta_rule):
//   S ← e^{g}·S;  m = Sᵀk̂;  δ = (v − m)·β;  S ← S + k̂ δᵀ;  o = Sᵀq̂      (decay first; o reads the UPDATED S)
//
// Chunked form (HF torch_chunk_gated_delta_rule, chunk 64), from any incoming state S: tokens are cut into chunks
// of 64, the last one padded with q = k = v = 0, g = 0, beta = 0 (decay 1, no update, so the final state is the
// state after the last real token). Within a chunk, G_t = Σ_{s<=t} g_s and Γ_ts = e^{G_t − G_s} for s <= t only
// (decays are formed as exponentials of differences on the masked triangle; never e^{−G}, never above the
// diagonal):
//   A   = −strict_lower((β⊙K) Kᵀ ⊙ Γ)
//   forward substitution, rows in order: A[i][j] += Σ_{m<i} A[i][m]·A[m][j]  (j < i; HF's loop), T = A + I
//   U   = T (β⊙V);   W = T (β⊙K⊙e^{G})
//   V'  = U − W S
//   O   = (Q̂⊙e^{G}) S + lower_incl_diag(Q̂ K̂ᵀ ⊙ Γ) V'
//   S   ← e^{G_last} S + (K̂ ⊙ e^{G_last − G})ᵀ V'
// It equals the recurrent form up to f32 rounding (tests/core/reference checks ~1e-5 relative).
// Pure apart from the state they update; thread-safe for distinct states.
#pragma once

namespace kestrel::ref {

inline constexpr int kDeltaRuleChunk = 64;

// One token. q, k: f32 [dk]; v: f32 [dv]; s: f32 [dk][dv] in/out; o: f32 [dv] out.
void delta_rule_step(const float* q, const float* k, const float* v, float g, float beta, int d_k, int d_v, float* s,
                     float* o);

// n_tok tokens. q, k: f32 [n_tok][dk]; v: f32 [n_tok][dv]; g, beta: f32 [n_tok]; s: f32 [dk][dv] in/out
// (initial state in, final state out); o: f32 [n_tok][dv] out. `chunk` > 0 (64 is the reference).
void delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n_tok,
                        int d_k, int d_v, float* s, float* o, int chunk = kDeltaRuleChunk);

}  // namespace kestrel::ref
