// Helpers shared by the core/reference tests: seeded random buffers, owned f32 weights with QuantMatrix views, and
// a norm-wise relative difference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/reference/matvec.h"

namespace kestrel::ref::test {

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// f32 weights [n_out][n_in] that own their storage; view() is the QuantMatrix the reference reads.
struct F32Weights {
  uint64_t n_in = 0, n_out = 0;
  std::vector<float> w;
  F32Weights() = default;
  F32Weights(uint64_t in, uint64_t out, uint32_t seed, float scale = 1.0f)
      : n_in(in), n_out(out), w(random_vec(static_cast<size_t>(in * out), seed, -scale, scale)) {}
  float& at(uint64_t o, uint64_t i) { return w[static_cast<size_t>(o * n_in + i)]; }
  float at(uint64_t o, uint64_t i) const { return w[static_cast<size_t>(o * n_in + i)]; }
  QuantMatrix view() const { return f32_matrix(w.data(), n_in, n_out); }
};

// max_i |a_i − b_i| / max(max_i |b_i|, floor): relative to the size of the reference b.
inline double max_rel_diff(const float* a, const float* b, size_t n, double floor = 1e-6) {
  double diff = 0.0, scale = floor;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}
// Infinite when the sizes differ.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  return max_rel_diff(a.data(), b.data(), a.size());
}

}  // namespace kestrel::ref::test
