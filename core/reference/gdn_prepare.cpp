// Reference GDN gates and q/k/v preparation (see gdn_prepare.h).
#include "core/reference/gdn_prepare.h"

#include <cmath>

#include "core/reference/activations.h"
#include "core/reference/norm.h"

namespace kestrel::ref {

void gdn_gates(const float* b, const float* a, const float* dt_bias, const float* ssm_a, int n_v_heads, float* beta,
               float* g) {
  for (int h = 0; h < n_v_heads; ++h) {
    beta[h] = sigmoid(b[h]);
    g[h] = ssm_a[h] * softplus(a[h] + dt_bias[h]);
  }
}

void gdn_split_qk_head(const GdnDims& dims, const float* u, int kh, float* q, float* k) {
  const int dk = dims.d_k;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  const size_t off = static_cast<size_t>(kh) * static_cast<size_t>(dk);
  l2_norm(u + off, dk, kL2NormEps, q + off);
  for (int i = 0; i < dk; ++i) q[off + static_cast<size_t>(i)] *= scale;
  l2_norm(u + dims.key_dim() + off, dk, kL2NormEps, k + off);
}

void gdn_split_qkv(const GdnDims& dims, const float* u, float* q, float* k, float* v) {
  for (int kh = 0; kh < dims.n_k_heads; ++kh) gdn_split_qk_head(dims, u, kh, q, k);
  const float* uv = u + 2 * dims.key_dim();
  for (int i = 0; i < dims.value_dim(); ++i) v[i] = uv[i];
}

}  // namespace kestrel::ref
