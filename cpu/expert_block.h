// The routed experts of one MoE layer over a batch of rows, each used expert's weights read once for all the rows
// that chose it (model-spec.md §5.1; the routed part of ref::moe_forward, and optionally the gated shared expert).
// The one code path for experts on the CPU: the CPU engine's FfnBlock runs it after its router, and the CPU
// ExpertBackend (expert_backend.h) runs it on the batches the hybrid engine hands over.
//
// A batch's (row, choice) pairs are packed by expert — ascending id, one expert's rows in batch order, choices
// marked kExpertNotHere left out — and each used expert runs once over its rows, read in place through a row index
// (no copy of x; one quantization of x serves every expert): gate and up as SwiGLU pairs of every used expert (and
// of the shared expert) in one pool job (matmul.h), the down products in another, each product cut into items of
// ~16 KiB of one expert's rows (row_block_rows), so every thread streams weights whatever the routing. Then, in a
// third job over blocks of each row's columns, each row's output is 0 plus its experts' outputs times their weights
// in ascending expert id, then plus sigmoid(shared gate logit) · shared expert — the reference's order, so a row's
// result does not depend on the other rows of the batch or on the thread count.
//
// Ownership: scratch is members, grown to the largest batch seen (nothing is allocated in a steady-state call).
// Threading: one call at a time, from the thread that drives the MatmulRunner.
#pragma once

#include <cstdint>
#include <vector>

#include "core/engine/expert_backend.h"
#include "core/reference/moe.h"
#include "cpu/matmul.h"
#include "cpu/step_profile.h"

namespace kestrel::cpu {

class ExpertBlock {
 public:
  // y[r] = Σ_{c in choices[r], c.expert != kExpertNotHere, ascending id} expert_c(x[r]) · c.weight
  //        (+ sigmoid(shared_logit[r]) · shared(x[r]) when shared_logit is not null).
  // w: the layer's weights (experts checked by ref::moe_check_weights and with kernels; the shared expert's only
  // read when shared_logit is set). x: f32 [n_rows, H]; choices: [n_rows, k], ids in [0, n_expert) and distinct
  // within a row (check_expert_batch) or kExpertNotHere, k <= kMaxExpertChoices; shared_logit: f32 [n_rows] or null;
  // y: f32 [n_rows, H], every row written, aliasing neither x nor choices. profile: nullptr, or where the packing and
  // products (kMoeExperts) and the weighted sums (kMoeCombine) add their time.
  void run(MatmulRunner& mm, const ref::MoeWeights& w, const float* x, int n_rows, const ExpertChoice* choices, int k,
           const float* shared_logit, float* y, StepProfile* profile);

 private:
  std::vector<int32_t> start_;   // int32 [E + 1]: first packed row of each expert
  std::vector<int32_t> fill_;    // int32 [E]: packed rows placed so far
  std::vector<int32_t> packed_;  // int32 [n_rows·k]: the batch row of each packed row
  std::vector<int32_t> slot_;    // int32 [n_rows, k]: the packed row of each (row, choice); -1 when skipped
  std::vector<int32_t> iota_;    // int32 [n_rows·k]: 0, 1, 2, ... (the packed rows in order)
  std::vector<float> ge_, ye_;   // packed rows: f32 [P, I] (SwiGLU), [P, H] (down)
  std::vector<float> sg_, sy_;   // shared expert: f32 [n_rows, I_s], [n_rows, H]
  std::vector<GemvTask> tasks_;
};

}  // namespace kestrel::cpu
