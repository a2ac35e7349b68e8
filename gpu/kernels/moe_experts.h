// moe_experts: the MoE FFN layer on the device for n_tok tokens (model-spec.md §5.1; ref::moe_forward is the
// oracle): router GEMV, routing (gpu/kernels/moe_router.h), the selected experts' SwiGLU FFNs GROUPED so that each
// expert's weights are read once per call for all the tokens routed to it, the routing-weighted sum of expert outputs
// per token in ascending expert order, plus the gated shared expert sigmoid(ffn_gate_inp_shexp · x) · FFN_sh(x).
//
// Expert tensors stay in their raw GGUF layout: [n_expert][n_rows][n_cols] blocks of any type gpu/kernels/dequant.cuh
// handles (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32), each element dequantized exactly as core does.
// Launches (on one stream, none waiting for the host): router gemv, moe_route, gate+up over (row tile, active
// expert) with the expert's token list, down likewise, the shared expert riding along in those two launches as one
// more "expert" with every token (its own launches when its types differ from the routed experts'), and a combine
// kernel that also computes the shared gate logit: 5 launches whatever n_tok (7 with mixed types). Fixed
// summation orders and no atomics: repeated runs are bit-identical.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "gpu/kernels/device_views.h"
#include "gpu/kernels/moe_hybrid.h"
#include "gpu/kernels/moe_router.h"

namespace kestrel::gpu {

// One MoE layer's weights on the device (the roles of ref::MoeWeights).
struct MoeDeviceWeights {
  int n_expert_used = 0;             // k
  DeviceMatrixView router;           // ffn_gate_inp     {H, E}: n_cols H, n_rows E
  DeviceExpertsView gate_exps;       // ffn_gate_exps    {H, I_e, E}
  DeviceExpertsView up_exps;         // ffn_up_exps      {H, I_e, E}
  DeviceExpertsView down_exps;       // ffn_down_exps    {I_e, H, E}
  DeviceMatrixView shared_gate_inp;  // ffn_gate_inp_shexp {H} as {H, 1}
  DeviceMatrixView gate_shexp;       // ffn_gate_shexp   {H, I_s}; data null when there is no shared expert
  DeviceMatrixView up_shexp;         // ffn_up_shexp     {H, I_s}
  DeviceMatrixView down_shexp;       // ffn_down_shexp   {I_s, H}
  bool has_shared_expert() const { return gate_shexp.data != nullptr; }
};

bool moe_supports(GgmlType type);

// kInvalidArgument naming the role and both shapes, or kUnsupported for a type, before anything runs.
Status moe_check_weights(const MoeDeviceWeights& w);

// Bytes of device scratch moe_forward needs for n_tok tokens (no initialisation needed).
size_t moe_workspace_bytes(const MoeDeviceWeights& w, int n_tok);

// What one moe_forward call enqueued, for benchmarks: kernel launches, and the routing it used (device pointers
// into the workspace, valid until the workspace is reused).
struct MoeLaunchInfo {
  int launches = 0;
  MoeRouting routing;
};

// x: device f32 [n_tok, H], 16-byte aligned; out: device f32 [n_tok, H], must not overlap x. 1 <= n_tok <=
// kMoeMaxTokens. workspace: device, >= moe_workspace_bytes(w, n_tok), 16-byte aligned. Errors (moe_check_weights,
// kInvalidArgument for n_tok/pointers) before anything is enqueued; otherwise the kernels are enqueued on `stream`
// and the call returns without waiting. info (host, optional) receives the launch count and the routing views.
// Thread-safe (no shared state); the caller keeps every buffer alive until the stream has run.
Status moe_forward(const MoeDeviceWeights& w, const float* x, int n_tok, float* out, void* workspace,
                   cudaStream_t stream, MoeLaunchInfo* info = nullptr);

// The hybrid layer (moe_hybrid.h): w's expert stacks hold only the resident experts (n_expert = h.n_resident,
// expert id e at h.resident[e]; null data when none is resident) while the router and the routing cover all E; the
// hooks run between the phases. Same workspace as moe_forward; the same checks plus moe_hybrid_check.
Status moe_forward_hybrid(const MoeDeviceWeights& w, const MoeHybrid& h, const float* x, int n_tok, float* out,
                          void* workspace, cudaStream_t stream, const MoePhaseHooks& hooks,
                          MoeLaunchInfo* info = nullptr);

// Groups of entries of a list, each group one expert of full raw stacks (every expert of a layer, at device-usable
// addresses: the hybrid layer's side read, moe_hybrid.h step 3b, reads them from mapped page-locked host memory),
// computed as moe_forward computes its routed experts: for each list position p of group g (first[g] <= p < end[g]),
// h[p] = silu(gate_x · x[token[p]]) · (up_x · x[token[p]]) and ye[out_entry[p]] = down_x · h[p], x = expert[g];
// each expert row is read once for all the group's positions. The groups' count is read on the device (*n_groups <=
// max_groups; the tables are written by a kernel before, e.g. moe_imma's hybrid routing). Rows of ye that no position
// names are not written. Two launches on `stream`, plain; errors (kInvalidArgument, kUnsupported) before anything is
// enqueued.
struct MoeExpertGroups {
  MoeBusStacks stacks;
  const int32_t* n_groups = nullptr;     // device [1]
  const int32_t* expert = nullptr;       // device [max_groups]
  const int32_t* first = nullptr;        // device [max_groups]
  const int32_t* end = nullptr;          // device [max_groups]
  const int32_t* entry_token = nullptr;  // device [positions]: x's row of each position
  const int32_t* out_entry = nullptr;    // device [positions]: ye's row of each position
  int max_groups = 0;
  int n_tok = 0;
  const float* x = nullptr;  // device f32 [n_tok, H], 16-byte aligned
  float* h = nullptr;        // device f32 [positions, I]
  float* ye = nullptr;       // device f32 [rows, H]
};
Status moe_expert_groups(const MoeExpertGroups& g, cudaStream_t stream);

}  // namespace kestrel::gpu
