// Reference partial NeoX RoPE (see rope.h for the formulas and how the angle is computed).
#include "core/reference/rope.h"

#include <cassert>
#include <cmath>
#include <vector>

namespace kestrel::ref {

void rope_inv_freq(int n_rot, float freq_base, float* inv_freq) {
  assert(n_rot % 2 == 0);
  for (int i = 0; i < n_rot / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(n_rot);
    inv_freq[i] = 1.0f / std::pow(freq_base, exponent);
  }
}

void rope_cos_sin(int n_rot, float freq_base, int64_t pos, float* cos_theta, float* sin_theta) {
  std::vector<float> inv_freq(static_cast<size_t>(n_rot / 2));  // f32 [n_rot/2]
  rope_inv_freq(n_rot, freq_base, inv_freq.data());
  const float p = static_cast<float>(pos);
  for (int i = 0; i < n_rot / 2; ++i) {
    const float theta = p * inv_freq[static_cast<size_t>(i)];
    cos_theta[i] = std::cos(theta);
    sin_theta[i] = std::sin(theta);
  }
}

void rope_neox_partial(float* x, int n_head, int head_dim, int n_rot, float freq_base, int64_t pos) {
  assert(n_rot % 2 == 0 && n_rot <= head_dim);
  const int half = n_rot / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));  // f32 [n_rot/2] each
  rope_cos_sin(n_rot, freq_base, pos, c.data(), s.data());
  for (int h = 0; h < n_head; ++h) {
    float* xh = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = xh[i];         // first half
      const float b = xh[i + half];  // second half
      const float ci = c[static_cast<size_t>(i)], si = s[static_cast<size_t>(i)];
      xh[i] = a * ci + (-b) * si;  // q·cos + rotate_half(q)·sin, rotate_half = [−x2, x1]
      xh[i + half] = b * ci + a * si;
    }
  }
}

}  // namespace kestrel::ref
