// moe_router: MoE routing on the device for n_tok tokens (model-spec.md §5.1; ref::moe_route is the oracle), and
// the per-expert token lists the grouped expert kernels (gpu/kernels/moe_experts.h) read.
//
// Per token, from the router logits (ffn_gate_inp · x, computed by gemv):
//   p   = softmax(logits) over all E experts (max subtracted, exp, sum, divide)
//   sel = the k largest p, ties to the LOWER expert index, listed by descending p
//   w_j = p_sel_j / max(Σ_j p_sel_j (summed in selection order), 2^-14)
// then the grouping: the (token, slot) entries sorted by (expert, token), the active (selected at least once)
// experts ascending with their entry ranges, and for each token its entries by ascending expert id (the order the
// reference sums expert outputs in). One kernel, one block; no atomics, so repeated runs are bit-identical.
// Differences from the reference: the softmax sum is lane-strided (≤ a few ulp in p), expf vs std::exp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/base/expected.h"

namespace kestrel::gpu {

inline constexpr int kMoeMaxTokens = 32;     // tokens per moe_route / moe_forward call
inline constexpr int kMoeMaxExperts = 1024;  // E
inline constexpr int kMoeMaxUsed = 32;       // k

// Device views of the routing of one call (all device memory; sizes for n_tok tokens, E experts, k used).
struct MoeRouting {
  int32_t* ids = nullptr;            // int32 [n_tok, k]  selected experts, by descending p (ties: lower id first)
  float* weights = nullptr;          // f32   [n_tok, k]  renormalised weights, same order
  int32_t* n_active = nullptr;       // int32 [1]         experts selected by at least one token
  int32_t* active_expert = nullptr;  // int32 [min(E, n_tok·k)]  their ids, ascending
  int32_t* active_offset = nullptr;  // int32 [min(E, n_tok·k) + 1] first entry of each active expert (+ the total)
  int32_t* entry_token = nullptr;    // int32 [n_tok·k]   token of each entry (entries sorted by expert, then token)
  float* entry_weight = nullptr;     // f32   [n_tok·k]   routing weight of each entry
  int32_t* token_entry = nullptr;    // int32 [n_tok, k]  entries of each token, by ascending expert id
};

// Bytes of device memory moe_routing_carve() lays a MoeRouting out in (16-byte aligned pieces).
size_t moe_routing_bytes(int n_tok, int n_expert, int k);

// Lays out a MoeRouting in `base` (device, 16-byte aligned, >= moe_routing_bytes(n_tok, n_expert, k)). Pure.
MoeRouting moe_routing_carve(void* base, int n_tok, int n_expert, int k);

// logits: device f32 [n_tok, n_expert]. 1 <= n_tok <= kMoeMaxTokens, 1 <= k <= min(n_expert, kMoeMaxUsed),
// n_expert <= kMoeMaxExperts; every pointer of `r` non-null. Errors (kInvalidArgument) before the launch; otherwise
// one kernel is enqueued on `stream` and the call returns without waiting. Thread-safe; the caller keeps the
// buffers alive until the stream has run.
Status moe_route(const float* logits, int n_tok, int n_expert, int k, const MoeRouting& r, cudaStream_t stream);

}  // namespace kestrel::gpu
