// The feed-forward half of a layer for one pass: the MoE FFN with its gated shared expert (model-spec.md §5.1;
// ref::moe_forward) or the dense SwiGLU FFN (§5.2; ref::dense_ffn_forward).
//
// MoE: the router over every row, ref::moe_route's operations per row (softmax over all experts, top-k, lower index
// first on ties, renormalised; over member buffers, so nothing is allocated in a step), then each selected expert once
// over the rows that chose it, read in place through a row index (no copy, one quantization of the input for all
// experts): gate and up as SwiGLU pairs of every expert and of the shared expert in one pool job (matmul.h), the down
// products in another — items of ~16 KiB of one expert's rows, so every thread streams whatever the routing. Each row
// sums its experts in ascending expert id, then adds sigmoid(shared gate) · shared expert, as the reference does, so a
// row's result does not depend on which other rows share the pass. Dense: gate/up as one SwiGLU pair, then down.
#pragma once

#include <cstdint>
#include <vector>

#include "core/reference/ffn.h"
#include "core/reference/moe.h"
#include "cpu/tick.h"

namespace kestrel::cpu {

class FfnBlock {
 public:
  // x: f32 [n_rows, H] normed input; out: f32 [n_rows, H] (may not alias x). Weights must have passed the
  // reference's checks (ref::moe_check_weights, ref::swiglu_check).
  void run_moe(const Pass& pass, const ref::MoeWeights& w, const float* x, float* out);
  void run_dense(const Pass& pass, const ref::DenseFfnWeights& w, const float* x, float* out);

 private:
  // ref::moe_route of one row of router logits (f32 [E]) into ids / weights (k each).
  void route(const float* logits, size_t E, size_t k, int32_t* ids, float* weights);

  std::vector<float> probs_;            // f32 [E]: one row's probabilities
  std::vector<uint8_t> taken_;          // [E]: experts already chosen for the row
  std::vector<float> logits_;           // f32 [R, E] router logits
  std::vector<int32_t> ids_;            // int32 [R, k] selected experts
  std::vector<float> wts_;              // f32 [R, k] their weights
  std::vector<int32_t> start_;          // int32 [E + 1]: first packed row of each expert
  std::vector<int32_t> fill_;           // int32 [E]: packed rows placed so far
  std::vector<int32_t> packed_;         // int32 [R·k]: the batch row of each packed row
  std::vector<int32_t> slot_;           // int32 [R, k]: the packed row of each (row, choice)
  std::vector<int32_t> iota_;           // int32 [R·k]: 0, 1, 2, ... (the packed rows in order)
  std::vector<float> ge_, ye_;          // packed rows: f32 [R·k, I] (SwiGLU), [R·k, H] (down)
  std::vector<float> sg_, sy_, sgate_;  // shared expert: f32 [R, I_s], [R, H], [R]
  std::vector<GemvTask> tasks_;
};

}  // namespace kestrel::cpu
