// moe_imma_prompt: the MoE FFN layer for the tokens of a prompt pass — up to kMoePromptMaxTokens tokens in one call,
// each routed expert's matrices read from memory once for all the tokens that chose it (model-spec.md §5.1;
// ref::moe_forward is the oracle; moe_imma.h is the same layer for up to kMoeMaxTokens tokens).
//
// One call, on one stream, no host synchronisation:
//   the router's logits and x's prepared form (moe_imma_route_inputs: moe_imma's arithmetic, one launch for an f32
//   router) → routing, a warp per token (moe_route's arithmetic) → grouping in one block: per expert a bit mask of its
//   tokens (atomicOr, so the result does not depend on the order), counts and first entries by one scan, each entry
//   at its expert's first + the tokens below it, and the segment tables (per active expert and chunk of up to C of its
//   tokens a gate, an up and a down segment, plus the shared expert's chunks; counted) → the grouped gate+up product
//   → gemv_imma_prepare_swiglu → the grouped down product → combine (moe_combine's order: Σ over each token's entries
//   by ascending expert id of w·y from 0, then + sigmoid(shared gate · x) · shared y).
// The grouped products run on gemm_imma_segments where it takes the experts' type (every type gemv_imma tiles) and
// GemvImmaTuning:: prompt_gemm is on, else on gemv_imma_segments. The entries, rows and tables have moe_imma_forward's
// layout and every per-token operation its arithmetic; on gemv_imma_segments a token's output is bit-identical to what
// moe_imma_forward gives it in a call of any size, on gemm_imma it agrees within f32 rounding (test_moe_imma).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/base/expected.h"
#include "gpu/kernels/moe_hybrid.h"  // MoeHybrid, MoePhaseHooks
#include "gpu/kernels/moe_imma.h"    // MoeImmaWeights

namespace kestrel::gpu {

// Tokens of one moe_imma_forward_prompt call.
inline constexpr int kMoePromptMaxTokens = 512;

// Bytes of device scratch for calls of up to n_tok tokens (any segment width); 0 when n_tok is out of [1,
// kMoePromptMaxTokens]. Needs no initialisation.
size_t moe_imma_prompt_workspace_bytes(const MoeImmaWeights& w, int n_tok);

// x: device f32 [n_tok, H], 16-byte aligned; out: device f32 [n_tok, H], not overlapping x; 1 <= n_tok <=
// kMoePromptMaxTokens; w: all routed experts resident (moe_imma_check_weights). workspace: device,
// >= moe_imma_prompt_workspace_bytes(w, n_tok), 16-byte aligned. segment_vectors: tokens per segment, 1..
// kImmaSegmentVectors (an expert chosen by more tokens is read once per chunk of this many, the later reads mostly
// from L2). Errors before anything is enqueued; otherwise the kernels are enqueued on `stream` (plain launches) and the
// call returns without waiting. hooks (optional): run after the grouping and before the combine (profiling records
// events there). Thread-safe; the caller keeps every buffer alive until the stream has run.
Status moe_imma_forward_prompt(const MoeImmaWeights& w, const float* x, int n_tok, float* out, void* workspace,
                               cudaStream_t stream, int segment_vectors, const GemvImmaTuning& grouped_gemv = {},
                               const MoePhaseHooks* hooks = nullptr);

// The hybrid layer (moe_hybrid.h's steps, as moe_imma_forward_hybrid takes them) for up to kMoePromptMaxTokens tokens:
// w's routed stacks hold only the resident experts (expert id e at slot h.resident[e]), the routing covers all E and
// writes h.host_choices [n_tok, k]; hooks.after_route runs after the grouping (the host gets all n_tok rows in one
// hand-off, so it reads each of its experts once for all the tokens that chose it), hooks.before_combine before the
// hybrid combine. h.host_y holds n_tok rows. Same workspace as moe_imma_forward_prompt.
Status moe_imma_forward_prompt_hybrid(const MoeImmaWeights& w, const MoeHybrid& h, const float* x, int n_tok,
                                      float* out, void* workspace, cudaStream_t stream, const MoePhaseHooks& hooks,
                                      int segment_vectors, const GemvImmaTuning& grouped_gemv = {});

}  // namespace kestrel::gpu
