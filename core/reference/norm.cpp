// Reference normalisations (see norm.h for the formulas and their sources).
#include "core/reference/norm.h"

#include <cmath>

#include "core/reference/activations.h"

namespace kestrel::ref {
namespace {

float sum_of_squares(const float* x, int n) { return dot_f32(x, x, n); }

}  // namespace

void rms_norm(const float* x, const float* w, int n, float eps, float* y) {
  const float mean = sum_of_squares(x, n) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void rms_norm_gated(const float* x, const float* z, const float* w, int n, float eps, float* y) {
  const float mean = sum_of_squares(x, n) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int i = 0; i < n; ++i) y[i] = ((x[i] * scale) * w[i]) * silu(z[i]);
}

void l2_norm(const float* x, int n, float eps, float* y) {
  const float inv_norm = 1.0f / std::sqrt(sum_of_squares(x, n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * inv_norm;
}

}  // namespace kestrel::ref
