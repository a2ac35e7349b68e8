// moe_hybrid: the device side of an MoE layer whose routed experts are split between the GPU and a host
// ExpertBackend (core/engine/expert_backend.h; issue 32). moe_forward_hybrid (moe_experts.h) and
// moe_imma_forward_hybrid (moe_imma.h) run it; this header holds what both share.
//
// The layer, on one stream:
//   1. the router and the routing over all E experts, on the device, as the all-resident layer runs them; then, per
//      token, its k choices are split: host_choices[t·k + j] = (id, weight) of selection j when expert id is not
//      resident, else (kExpertNotHere, 0) — the routing's selection order, which ExpertBatch accepts — and the
//      routing's entries of host experts are marked (their entry weight set to −1; routing weights are >= 0) so that
//      nothing on the device reads their rows;
//   2. hooks.after_route(): the caller's enqueued hand-off (the engine's: expert_handoff_publish, x and host_choices
//      into mapped host memory for the thread that runs the ExpertBackend, gpu/engine/host_expert_link.h);
//   3. the resident experts (read from compact stacks: expert id → resident[id]) and the shared expert, as the
//      all-resident layer computes them, skipping host experts (no launch at all when nothing is resident and there
//      is no shared expert);
//      3b. with the side read (MoeHybrid::bus set; moe_imma_forward_hybrid only): of each token's h host choices in
//      selection order, the last round(h · bus_share) are read by the device itself, in place, from the page-locked
//      host copy over the bus (moe_experts.h's raw-block grouped kernel on mapped pointers: moe_expert_groups) while
//      the host's workers read the others from DRAM — the host's memory serves both at once
//      (dev/notes/hybrid-next.md: ~49 GB/s over the bus beside ~85 from 14 threads on the lent H100 box). The rule is
//      the token's own, so its bits do not depend on its batch. Step 1 gives those choices to nobody on the host
//      (kExpertNotHere) and keeps their entry weights, so the combine reads their rows as a resident expert's. An
//      expert with bus entries is read over the bus once for all of them;
//   4. hooks.before_combine(): the caller's join (the engine's: expert_handoff_join, which waits for the host's
//      answer and copies its partial sums into host_y);
//   5. the combine, in this fixed order per token t and column c:
//        y  = 0;  for each of t's device entries (resident or read over the bus) by ascending expert id:
//                   y += ye_entry · w_entry
//        y += host_y[t]                       (the backend's Σ over t's host experts by ascending id, from 0)
//        y += sigmoid(shared_gate · x_t) · shared_t      (with a shared expert)
//      The reference sums all k experts by ascending id in one sum: the split differs from it by the rounding of one
//      extra addition (f32 addition is not associative); with every expert resident and host_y zero it is the
//      all-resident combine's sum.
// Fixed orders and no atomics: repeated runs are bit-identical, and a token's row does not depend on the others.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "core/base/expected.h"
#include "core/engine/expert_backend.h"
#include "gpu/kernels/device_views.h"
#include "gpu/kernels/moe_router.h"

namespace kestrel::gpu {

// A layer's three routed-expert stacks in raw GGUF blocks, expert-major ([n_expert][n_rows][n_cols]), device-usable.
struct MoeBusStacks {
  DeviceExpertsView gate;  // {H, I, E}
  DeviceExpertsView up;    // {H, I, E}
  DeviceExpertsView down;  // {I, H, E}
};

// Which routed experts of a layer the device holds, and the device buffers of the host hand-off.
struct MoeHybrid {
  const int32_t* resident = nullptr;     // device int32 [E]: expert id → its index in the compact stacks, or
                                         // kExpertNotHere (computed on the host)
  int32_t n_resident = 0;                // experts in the compact stacks (0: none; the stacks may then be null)
  ExpertChoice* host_choices = nullptr;  // device [n_tok, k]: written by step 1
  const float* host_y = nullptr;         // device f32 [n_tok, H]: read by the combine (step 5)
  // Step 3b: the layer's full raw expert stacks (every expert, as the file holds them) at device-usable mapped
  // addresses of page-locked host memory (gpu/memory/pinned_experts.h); data null: no side read.
  MoeBusStacks bus;
  float bus_share = 0.0f;  // in [0, 1]: the share of each token's host choices read over the bus (0: none)
  bool side_read() const { return bus.gate.data != nullptr && bus_share > 0.0f; }
};

// Callbacks between a MoE layer's phases: after the router's logits (and x's prepared form), after the routing (step 2
// of a hybrid layer: the hand-off to the host) and before the combine (step 4: the join). Each enqueues on the layer's
// stream and returns an error to abort the layer (nothing after it is enqueued). Any may be empty. Profiling passes
// record events there (forward_pass.h).
struct MoePhaseHooks {
  std::function<Status()> after_logits;
  std::function<Status()> after_route;
  std::function<Status()> before_combine;
};

// kInvalidArgument naming what is wrong: a null pointer, n_resident outside [0, n_expert].
Status moe_hybrid_check(const MoeHybrid& h, int64_t n_expert);

// Step 1's split for a routing moe_route wrote (moe_forward_hybrid's): one block, enqueued on `stream`.
Status moe_hybrid_split(const MoeRouting& r, int n_tok, int k, const MoeHybrid& h, cudaStream_t stream);

// Step 5 for n_tok tokens of h columns. ye: device f32 rows of the entries (token_entry's values index them);
// sh: device f32 [n_tok, h] of the shared expert's outputs, or null without a shared expert (then shared_gate_inp is
// ignored); x: the layer's input f32 [n_tok, h] (the shared gate's); out: f32 [n_tok, h]. One launch, plain (no
// programmatic dependency: it follows the host copy).
struct MoeHybridCombine {
  const float* ye = nullptr;
  const int32_t* token_entry = nullptr;  // [n_tok, k] by ascending expert id
  const float* entry_weight = nullptr;   // host entries marked −1
  int k = 0;
  const float* host_y = nullptr;
  const float* sh = nullptr;
  DeviceMatrixView shared_gate_inp;
  const float* x = nullptr;
  int n_tok = 0;
  int h = 0;
  float* out = nullptr;
};
Status moe_hybrid_combine(const MoeHybridCombine& c, cudaStream_t stream);

}  // namespace kestrel::gpu
