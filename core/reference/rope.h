// Reference partial NeoX RoPE of the gated full-attention layers (model-spec.md §4, §8).
//
// For each head, dims [0, n_rot) rotate in half-split pairs (i, i + n_rot/2), i < n_rot/2; dims [n_rot, head_dim)
// are untouched:
//   x_i'          = x_i · cos θ_i − x_{i+n_rot/2} · sin θ_i
//   x_{i+n_rot/2}' = x_{i+n_rot/2} · cos θ_i + x_i · sin θ_i,      θ_i = pos · base^(−2i/n_rot)
// The angle is computed the way HF does (Qwen3Next/Qwen3_5 rotary embedding, default rope, attention_scaling 1):
//   inv_freq_i = 1 / base^((2i) / n_rot)   all f32: (float)(2i) / (float)n_rot, powf, then 1.0f / ·
//   θ_i        = (float)pos · inv_freq_i   one f32 product
//   cos θ_i, sin θ_i in f32 (cosf, sinf)
// and the rotation is HF's q·cos + rotate_half(q)·sin, term for term. Qwen3.5's interleaved MRoPE equals this 1-D
// rope for text tokens (all three position axes equal the token index), so one function serves both families.
// Pure and thread-safe.
#pragma once

#include <cstdint>

namespace kestrel::ref {

// inv_freq: f32 [n_rot / 2]. n_rot must be even.
void rope_inv_freq(int n_rot, float freq_base, float* inv_freq);

// cos_theta, sin_theta: f32 [n_rot / 2] for position pos.
void rope_cos_sin(int n_rot, float freq_base, int64_t pos, float* cos_theta, float* sin_theta);

// Rotates, in place, n_head heads at one position. x: f32 [n_head, head_dim]; n_rot <= head_dim, n_rot even.
void rope_neox_partial(float* x, int n_head, int head_dim, int n_rot, float freq_base, int64_t pos);

}  // namespace kestrel::ref
