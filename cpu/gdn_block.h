// The Gated DeltaNet layer of one pass (model-spec.md §3; ref::gdn_forward): the input projections and ssm_out over
// every row of the pass (one read of each matrix), then per session the conv step, split and gates token by token
// with core/reference's per-token functions, the delta rule (cpu/delta_rule.h) and the gated norm. The delta rule
// runs the chunked form over every chunk of kDeltaRuleChunk (64) sequence positions aligned to a multiple of 64
// that lies wholly in the pass, and the recurrent step for the other tokens. So a prompt's result depends on where
// the passes cut it only through which whole aligned chunks they leave intact: cuts at multiples of 64 positions
// (the engine's passes and the Service's prefill ticks from position 0) give the same bits as one pass; other cuts
// agree to f32 rounding (the two forms' difference). Decode tokens are always recurrent, and nothing depends on
// the other sessions in the pass or on the thread count. At the scalar level the kernels are the reference's own.
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
