// The Gated DeltaNet layer of one pass (model-spec.md §3; ref::gdn_forward in recurrent mode): the input
// projections and ssm_out over every row of the pass (one read of each matrix), the conv step, split, gates, delta
// rule and gated norm per session, token by token, with core/reference's per-token functions. Per session the
// operations are exactly the reference's recurrent ones; only the projections' summation order differs (gemv.h).
//
// Parallel items: conv + split + gates one per segment; delta rule + gated norm one per (segment, V-head) pair.
#pragma once

#include <vector>

#include "core/reference/gdn_layer.h"
#include "cpu/tick.h"

namespace kestrel::cpu {

class GdnBlock {
 public:
  // x: f32 [n_rows, H] normed input; out: f32 [n_rows, H]. `layer` indexes each segment's SessionState::gdn.
  // Weights must have passed ref::gdn_check_weights.
  void run(const Pass& pass, const ref::GdnWeights& w, uint32_t layer, const float* x, float* out);

 private:
  std::vector<float> mixed_, z_, b_, a_, extra_;  // projections: f32 [R, C], [R, Vd], [R, Vh] ×2, [R, wide]
  std::vector<float> u_, q_, k_, v_, beta_, g_;   // per row: conv out, q̂, k̂, v, beta, g
  std::vector<float> o_, n_;                      // delta rule output, gated norm: f32 [R, Vd]
};

}  // namespace kestrel::cpu
