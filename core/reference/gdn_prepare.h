// Reference per-token preparation of the delta-rule inputs: gates (model-spec.md §3.2) and the split, L2 norm and
// scaling of q/k/v (§3.4).
//
// Gates, per V-head h (GGUF ssm_a = −exp(A_log) already):
//   beta_h = sigmoid(b_h)
//   g_h    = ssm_a_h · softplus(a_h + dt_bias_h)     (softplus threshold 20; g_h <= 0, decay e^{g_h} in (0, 1])
// Split of the conv output u (after SiLU) into q [Kh][dk] (channels [0, key_dim)), k [Kh][dk] ([key_dim,
// 2·key_dim)) and v [Vh][dv] (the rest), then per K-head, as HF torch_*_gated_delta_rule with
// use_qk_l2norm_in_kernel: q̂ = l2norm(q) · (1/sqrt(dk)), k̂ = l2norm(k) (eps 1e-6; the scale is q-only, §8).
// The scale is the f32 value of 1/sqrt(dk) computed in double, applied as a second multiply (HF: query * scale).
// Pure and thread-safe.
#pragma once

#include "core/reference/gdn_state.h"

namespace kestrel::ref {

// b, a, dt_bias, ssm_a, beta, g: f32 [n_v_heads].
void gdn_gates(const float* b, const float* a, const float* dt_bias, const float* ssm_a, int n_v_heads, float* beta,
               float* g);

// u: f32 [C] conv output; q, k: f32 [Kh][dk] out (q̂ scaled, k̂); v: f32 [Vh][dv] out.
void gdn_split_qkv(const GdnDims& dims, const float* u, float* q, float* k, float* v);

// K-head kh of gdn_split_qkv (the same bits): q̂ and k̂ of that head into q, k (f32 [Kh][dk]; only head kh's dk
// entries are written), so that heads can be prepared apart.
void gdn_split_qk_head(const GdnDims& dims, const float* u, int kh, float* q, float* k);

}  // namespace kestrel::ref
