// Reference de-interleaving of the qwen3next fused GDN projections (model-spec.md §3.1, §6.2, §6.3).
//
// HF in_proj_qkvz (GGUF legacy `ssm_in`) output, viewed as [Kh][2·dk + 2·r·dv], per K-group g:
//   [q_g (dk) | k_g (dk) | v_g (r·dv: V-heads g·r … g·r+r−1) | z_g (r·dv: same V-heads)]
// becomes mixed_qkv = [q_0 … q_{Kh−1} | k_0 … k_{Kh−1} | v_0 … v_{Kh−1}] (what attn_qkv produces) and
// z = [z_0 … z_{Kh−1}] (what attn_gate produces).
// HF in_proj_ba (GGUF `ssm_ba`, never split by the converter) output, viewed as [Kh][2·r], per K-group g:
//   b[g·r + j] = ba[g·2r + j],  a[g·r + j] = ba[g·2r + r + j],  j < r.
// V heads stay in HF (grouped) order. Pure and thread-safe.
#pragma once

#include "core/reference/gdn_state.h"

namespace kestrel::ref {

// qkvz: f32 [2·key_dim + 2·value_dim]; mixed_qkv: f32 [C] out; z: f32 [value_dim] out.
void gdn_deinterleave_qkvz(const GdnDims& dims, const float* qkvz, float* mixed_qkv, float* z);

// ba: f32 [2·Vh]; b, a: f32 [Vh] out.
void gdn_split_ba(const GdnDims& dims, const float* ba, float* b, float* a);

}  // namespace kestrel::ref
