// Reference de-interleaving of qwen3next's per-K-group qkvz and ba projections (see gdn_layout.h).
#include "core/reference/gdn_layout.h"

#include <algorithm>

namespace kestrel::ref {

void gdn_deinterleave_qkvz(const GdnDims& dims, const float* qkvz, float* mixed_qkv, float* z) {
  const size_t dk = static_cast<size_t>(dims.d_k);
  const size_t rdv = static_cast<size_t>(dims.v_per_k()) * dims.d_v;  // r·dv
  const size_t group = 2 * dk + 2 * rdv;
  const size_t key_dim = static_cast<size_t>(dims.key_dim());
  for (size_t g = 0; g < static_cast<size_t>(dims.n_k_heads); ++g) {
    const float* src = qkvz + g * group;
    std::copy(src, src + dk, mixed_qkv + g * dk);                                    // q_g
    std::copy(src + dk, src + 2 * dk, mixed_qkv + key_dim + g * dk);                 // k_g
    std::copy(src + 2 * dk, src + 2 * dk + rdv, mixed_qkv + 2 * key_dim + g * rdv);  // v_g
    std::copy(src + 2 * dk + rdv, src + 2 * dk + 2 * rdv, z + g * rdv);              // z_g
  }
}

void gdn_split_ba(const GdnDims& dims, const float* ba, float* b, float* a) {
  const int r = dims.v_per_k();
  for (int g = 0; g < dims.n_k_heads; ++g) {
    for (int j = 0; j < r; ++j) {
      b[g * r + j] = ba[g * 2 * r + j];
      a[g * r + j] = ba[g * 2 * r + r + j];
    }
  }
}

}  // namespace kestrel::ref
