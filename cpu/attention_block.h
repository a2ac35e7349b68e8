// The gated full-attention layer of one pass (model-spec.md §4; ref::attn_forward): Q/K/V and the output projection
// over every row of the pass (one read of each matrix); per session the q/k norms, RoPE (ref::rope_neox_partial's
// operations, over per-thread buffers, so a step allocates nothing), the KV-cache append and causal attention per
// (token, head) with the level's kernel (attend.h: the reference's arithmetic at the scalar level, FMA dot products
// and register-blocked weighted sums above it).
//
// Parallel items: norms + RoPE + append one per segment; attention one per (segment, query head) pair.
#pragma once

#include <vector>

#include "core/reference/attention.h"
#include "cpu/tick.h"

namespace kestrel::cpu {

class AttentionBlock {
 public:
  // x: f32 [n_rows, H] normed input; out: f32 [n_rows, H]. `layer` indexes each segment's SessionState::kv. Each
  // segment's cache holds n_past tokens and has room for n_tok more (the engine checks before the pass).
  void run(const Pass& pass, const ref::AttnWeights& w, uint32_t layer, const float* x, float* out);

 private:
  std::vector<float> qg_, k_, v_;      // f32 [R, n_head·2hd], [R, n_kv·hd] ×2
  std::vector<float> q_, gate_, att_;  // f32 [R, n_head, hd] each
};

}  // namespace kestrel::cpu
