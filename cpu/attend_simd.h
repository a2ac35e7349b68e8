// The SIMD attention kernel shared by attend_avx2.cpp and attend_avx512.cpp (attend.h). Each includer defines
// KESTREL_ATTEND_NS (a namespace of its own, so copies compiled with different flags never merge at link time) and a
// traits struct S: Vec, kLanes, kBlockVecs (output vectors kept in registers per pass over the positions), zero(),
// set1(float), loadu(const float*), storeu(float*, Vec), add, fma(a, b, c) = a·b + c, hsum(Vec) (fixed order).
// head_dim is a multiple of kLanes (attend_kernel() checks).
#pragma once

#ifndef KESTREL_ATTEND_NS
#error "define KESTREL_ATTEND_NS before including cpu/attend_simd.h"
#endif

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/reference/activations.h"
#include "cpu/attend.h"
#include "cpu/simd_f32.h"

namespace kestrel::cpu::KESTREL_ATTEND_NS {

template <class S>
void attend(const ref::KvCache& cache, int kv_head, int n_pos, const float* q, float scale, float* out) {
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes, B = S::kBlockVecs;
  thread_local std::vector<float> p;  // f32 [n_pos]: scores, then probabilities
  if (p.size() < static_cast<size_t>(n_pos)) p.resize(static_cast<size_t>(n_pos));
  const int hd = cache.head_dim;
  // Scores: lanes of even and odd vectors in two accumulators, then their sum's fixed-order reduction.
  for (int pos = 0; pos < n_pos; ++pos) {
    const float* k = cache.k_at(pos, kv_head);
    Vec a0 = S::zero(), a1 = S::zero();
    int i = 0;
    for (; i + 2 * L <= hd; i += 2 * L) {
      a0 = S::fma(S::loadu(q + i), S::loadu(k + i), a0);
      a1 = S::fma(S::loadu(q + i + L), S::loadu(k + i + L), a1);
    }
    if (i < hd) a0 = S::fma(S::loadu(q + i), S::loadu(k + i), a0);
    p[static_cast<size_t>(pos)] = S::hsum(S::add(a0, a1)) * scale;
  }
  ref::softmax(p.data(), n_pos);
  // out = Σ_p prob_p · V[p], B vectors of the head's dims at a time, positions in order.
  for (int j0 = 0; j0 < hd; j0 += B * L) {
    simd::with_vecs<B>(
        std::min(B, (hd - j0) / L), [&](auto nbc) __attribute__((always_inline)) {
          constexpr int nb = decltype(nbc)::value;
          Vec acc[nb];
          KESTREL_SIMD_UNROLL
          for (int b = 0; b < nb; ++b) acc[b] = S::zero();
          for (int pos = 0; pos < n_pos; ++pos) {
            const Vec w = S::set1(p[static_cast<size_t>(pos)]);
            const float* v = cache.v_at(pos, kv_head) + j0;
            KESTREL_SIMD_UNROLL
            for (int b = 0; b < nb; ++b) acc[b] = S::fma(w, S::loadu(v + b * L), acc[b]);
          }
          KESTREL_SIMD_UNROLL
          for (int b = 0; b < nb; ++b) S::storeu(out + j0 + b * L, acc[b]);
        });
  }
}

}  // namespace kestrel::cpu::KESTREL_ATTEND_NS
