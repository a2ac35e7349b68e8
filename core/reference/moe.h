// Reference MoE FFN with gated shared expert (model-spec.md §5.1, §8).
//
// Per token (x normed by post_attention_norm):
//   p   = softmax(W_router x)            over ALL E experts, f32 (softmax first, then top-k)
//   sel = the k largest p; ties go to the LOWER expert index (a total order, so routing is deterministic; HF's
//         torch.topk does not document its tie order, llama.cpp's argsort neither)
//   w_e = p_e / max(Σ_{sel} p, 6.103515625e-5)   (llama.cpp's clamp; HF divides by the plain sum — identical
//         unless the selected mass is below 2^-14)
//   y   = Σ_{e ∈ sel, ascending e} (down_e(silu(gate_e x) ⊙ up_e x) · w_e)   (HF sums experts in index order)
//   y  += sigmoid(w_shgate · x) · down_sh(silu(gate_sh x) ⊙ up_sh x)       when the shared expert is present
// No expert-weight scaling, no bias. Thread-safe; weights are only read.
#pragma once

#include <cstdint>

#include "core/base/expected.h"
#include "core/reference/matvec.h"

namespace kestrel::ref {

inline constexpr float kMoeWeightSumMin = 6.103515625e-5f;  // 2^-14, llama.cpp build_moe_ffn

// Non-owning views. Shapes in ggml order.
struct MoeWeights {
  int n_expert_used = 0;        // k (expert_used_count)
  QuantMatrix router;           // ffn_gate_inp.weight       {H, E}
  QuantExperts gate_exps;       // ffn_gate_exps.weight      {H, I_e, E}
  QuantExperts up_exps;         // ffn_up_exps.weight        {H, I_e, E}
  QuantExperts down_exps;       // ffn_down_exps.weight      {I_e, H, E}
  QuantMatrix shared_gate_inp;  // ffn_gate_inp_shexp.weight {H} viewed as {H, 1}
  QuantMatrix gate_shexp;       // ffn_gate_shexp.weight     {H, I_s}; empty (data null) when there is no shared expert
  QuantMatrix up_shexp;         // ffn_up_shexp.weight       {H, I_s}
  QuantMatrix down_shexp;       // ffn_down_shexp.weight     {I_s, H}

  bool has_shared_expert() const { return gate_shexp.data != nullptr; }
};

Status moe_check_weights(const MoeWeights& w);

// Routing of one token. logits: f32 [n_expert] (router output); ids: int32 [k] out, by descending probability
// (ties: lower index first); weights: f32 [k] out, renormalised. 1 <= k <= n_expert.
void moe_route(const float* logits, int n_expert, int k, int32_t* ids, float* weights);

// The MoE layer. x: f32 [n_tok, H]; out: f32 [n_tok, H] (may not alias x).
// selected: int32 [n_tok, k] out (the ids of moe_route per token), or nullptr.
Status moe_forward(const MoeWeights& w, const float* x, int n_tok, float* out, int32_t* selected = nullptr);

}  // namespace kestrel::ref
