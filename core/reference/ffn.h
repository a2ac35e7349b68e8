// Reference SwiGLU feed-forward: the dense FFN of qwen35 (model-spec.md §5.2) and the building block of every MoE
// expert and the shared expert (§5.1).
//   y = W_down · ( silu(W_gate x) ⊙ (W_up x) )        f32, no bias
// Thread-safe; weights are only read.
#pragma once

#include "core/base/expected.h"
#include "core/reference/matvec.h"

namespace kestrel::ref {

// Non-owning views. Shapes in ggml order {n_in, n_out}.
struct DenseFfnWeights {
  QuantMatrix gate;  // ffn_gate.weight {H, I}
  QuantMatrix up;    // ffn_up.weight   {H, I}
  QuantMatrix down;  // ffn_down.weight {I, H}
};

// kInvalidArgument unless gate/up are {H, I} and down is {I, H} for one H and I (read from gate).
Status swiglu_check(const QuantMatrix& gate, const QuantMatrix& up, const QuantMatrix& down, const char* what);

// x: f32 [n_tok, H]; y: f32 [n_tok, H] (may not alias x). The matrices must pass swiglu_check.
Status swiglu_forward(const QuantMatrix& gate, const QuantMatrix& up, const QuantMatrix& down, const float* x,
                      int n_tok, float* y);

// The dense FFN layer. x: f32 [n_tok, H] (normed by post_attention_norm); out: f32 [n_tok, H].
Status dense_ffn_forward(const DenseFfnWeights& w, const float* x, int n_tok, float* out);

}  // namespace kestrel::ref
