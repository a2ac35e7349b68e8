// The feed-forward half of a layer for one pass: the MoE FFN with its gated shared expert (model-spec.md §5.1;
// ref::moe_forward) or the dense SwiGLU FFN (§5.2; ref::dense_ffn_forward).
//
// MoE: the router and the shared expert's gate logit over every row in one pool job, ref::moe_route's operations per
// row (softmax over all experts, top-k, lower index first on ties, renormalised; over member buffers, so nothing is
// allocated in a step) into ExpertChoices, then ExpertBlock (expert_block.h) — the same code the CPU ExpertBackend
// runs — computes each selected expert once over the rows that chose it and the shared expert in the same two pool
// jobs, and sums each row's experts in ascending expert id, then adds sigmoid(shared gate) · shared expert, as the
// reference does, so a row's result does not depend on which other rows share the pass. Dense: gate/up as one
// SwiGLU pair, then down.
#pragma once

#include <cstdint>
#include <vector>

#include "core/engine/expert_backend.h"
#include "core/reference/ffn.h"
#include "core/reference/moe.h"
#include "cpu/expert_block.h"
#include "cpu/tick.h"

namespace kestrel::cpu {

class FfnBlock {
 public:
  // x: f32 [n_rows, H] normed input; out: f32 [n_rows, H] (may not alias x). Weights must have passed the
  // reference's checks (ref::moe_check_weights, ref::swiglu_check). expert_counts: nullptr, or [n_expert] counters
  // each row's chosen experts are added to (the placement planner's routing counts).
  void run_moe(const Pass& pass, const ref::MoeWeights& w, const float* x, float* out,
               uint64_t* expert_counts = nullptr);
  void run_dense(const Pass& pass, const ref::DenseFfnWeights& w, const float* x, float* out);

 private:
  // ref::moe_route of one row of router logits (f32 [E]) into k choices.
  void route(const float* logits, size_t E, size_t k, ExpertChoice* choices);

  std::vector<float> probs_;           // f32 [E]: one row's probabilities
  std::vector<uint8_t> taken_;         // [E]: experts already chosen for the row
  std::vector<float> logits_;          // f32 [R, E] router logits
  std::vector<float> sgate_;           // f32 [R]: shared expert gate logits
  std::vector<ExpertChoice> choices_;  // [R, k] selected experts and their weights
  std::vector<float> dense_;           // f32 [R, I]: the dense FFN's silu(gate) · up
  std::vector<GemvTask> tasks_;
  ExpertBlock experts_;
};

}  // namespace kestrel::cpu
