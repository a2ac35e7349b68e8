// Scalar f32 activations and the dot product shared by the reference ops (model-spec.md §3.2, §3.7, §4, §5, §8).
//
// Numerics policy of core/reference (applies to every file in this folder):
// - Everything is f32: inputs, weights after dequantization, accumulators, state. No double accumulation anywhere,
//   because HF (the golden source) computes these ops in f32 as well. Sums run sequentially in index order
//   (`for i in 0..n-1: acc += a[i] * b[i]`), so a result depends only on its inputs, never on batch composition or
//   threading: the same inputs give bit-identical outputs on every run.
// - Transcendentals use the <cmath> float overloads (expf, logf, log1pf, sqrtf, powf, cosf, sinf).
// - The functions are meant to be read next to the spec; fast paths (cpu/, gpu/) are tested against them with a
//   tolerance, not bit-for-bit.
// All functions here are pure and thread-safe.
#pragma once

#include <cmath>

namespace kestrel::ref {

// 1 / (1 + e^-x). For very negative x, e^-x overflows to +inf and the result is 0, as in PyTorch.
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// x * sigmoid(x) (PyTorch F.silu).
inline float silu(float x) { return x * sigmoid(x); }

// log(1 + e^x), returning x itself when x > 20 (PyTorch F.softplus default threshold; ggml uses the same), §3.2.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Σ_i a[i]·b[i] over i = 0..n-1, accumulated in f32 in index order.
inline float dot_f32(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// In place: x_i ← e^(x_i − max) / Σ_j e^(x_j − max) over n values (nothing for n <= 0) (f32, sums in index order; the
// normalisation is a division, as PyTorch's softmax). Used by the router (§5.1) and attention (§4).
inline void softmax(float* x, int n) {
  if (x == nullptr || n <= 0) return;
  float max_v = x[0];
  for (int i = 1; i < n; ++i) max_v = x[i] > max_v ? x[i] : max_v;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_v);
    sum += x[i];
  }
  for (int i = 0; i < n; ++i) x[i] = x[i] / sum;
}

}  // namespace kestrel::ref
