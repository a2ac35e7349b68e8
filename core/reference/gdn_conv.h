// Reference causal depthwise conv1d + SiLU of the Gated DeltaNet (model-spec.md §3.3, §8).
//
// Per channel c < C with taps w[c][i], i < K (GGUF ssm_conv1d {K, C}: w[c][i] at c·K + i; no bias):
//   y_c(t) = Σ_{i=0}^{K−1} w[c][i] · window_c[t + i],   u_c(t) = silu(y_c(t))
// where window_c = [conv_state_c (K−1 raw inputs, oldest first), x_c(0), …, x_c(T−1)], so w[c][K−1] multiplies the
// current token. Afterwards the state holds the last K−1 columns of the window (llama.cpp build_conv_state): for
// T < K−1 it still contains older state columns. The state stores raw inputs (pre-conv, pre-SiLU).
// The step (decode) and prefill forms run the same arithmetic (taps summed in order i = 0..K−1, f32), so prefill of
// T tokens gives bit-identical outputs and state to T steps. Pure apart from the state they update; thread-safe
// for distinct states.
#pragma once

namespace kestrel::ref {

// One token. w: f32 [C][K]; x: f32 [C] raw mixed_qkv; conv_state: f32 [C][K−1] in/out; u: f32 [C] out.
void gdn_conv_step(const float* w, int n_ch, int kernel, const float* x, float* conv_state, float* u);

// n_tok tokens. x: f32 [n_tok][C]; conv_state: f32 [C][K−1] in/out; u: f32 [n_tok][C] out.
void gdn_conv_prefill(const float* w, int n_ch, int kernel, const float* x, int n_tok, float* conv_state, float* u);

}  // namespace kestrel::ref
