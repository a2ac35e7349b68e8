// Reference normalisations: RMSNorm (model-spec.md §2, §2.1, §4), the gated RMSNorm of the GDN output (§3.7) and
// the L2 norm of GDN queries and keys (§3.4, §8).
//
// RMSNorm:        y_i = (x_i · s) · w_i,               s = 1 / sqrt(Σ x_j² / n + eps)
// gated RMSNorm:  y_i = ((x_i · s) · w_i) · silu(z_i)  (one V-head of dv values; w = ssm_norm, NOT +1)
// L2 norm:        y_i = x_i · (1 / sqrt(Σ x_j² + eps)) HF/FLA `l2norm` (rsqrt(Σx² + eps)), eps = 1e-6.
//                 llama.cpp's ggml_l2_norm instead computes x / max(‖x‖, eps); both agree to f32 rounding unless
//                 ‖x‖ is ~1e-3 or smaller (model-spec §8 calls the difference negligible). The reference follows HF.
// Weights of GGUF norms already carry the +1 of the zero-centred HF norms (§2.1): these functions never add it.
// Statistics are f32, summed in index order; s is computed once and multiplied in, as HF does (x · rsqrt(...)).
// y may equal x (in place); otherwise the buffers must not overlap. Pure and thread-safe.
#pragma once

namespace kestrel::ref {

inline constexpr float kL2NormEps = 1e-6f;  // HF/FLA l2norm eps in the GDN kernels

// x, w, y: f32 [n].
void rms_norm(const float* x, const float* w, int n, float eps, float* y);

// x (o_h), z (gate z_h), w (ssm_norm), y: f32 [n].
void rms_norm_gated(const float* x, const float* z, const float* w, int n, float eps, float* y);

// x, y: f32 [n].
void l2_norm(const float* x, int n, float eps, float* y);

}  // namespace kestrel::ref
