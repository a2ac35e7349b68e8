// moe_imma_one: the MoE layer of moe_imma (gpu/moe_imma.h) for ONE token in one launch — the path moe_imma_forward
// takes at n_tok == 1 where moe_imma_one_supports() holds. Internal to moe_imma: callers use moe_imma_forward.
//
// The six-launch chain (router → route + tables → gate+up → SwiGLU preparation → down → combine) spends most of a
// one-token layer on its launches' latencies (docs/benchmarks.md, "MoE layer: what each launch costs in the chain":
// the four small kernels 11.7 of 22.6 µs). Here every warp of a persistent, co-resident grid takes a fixed list of
// warp tasks and each task waits only for what it reads (arrivals counted with release increments; the arrival that
// completes a count sets a bit in every block's flag word, which that block's warps poll):
//   x's preparation (a warp per 256-element group), the shared-expert gate logit, the router's logits (a warp per
//   expert), the shared expert's and then the routed experts' gate+up, then all down tasks;
//   the warp whose arrival completes the logits routes, once for the grid, and publishes the routing;
//   the last of a row group's gate+up tasks adds its partial sums and applies SwiGLU, the last row group of an
//   activation group prepares that group for the down GEMV, and the last down task of an output row group combines
//   the experts' rows into `out`.
// Weights are loaded before the wait for the activations they multiply. Not faster than the chain yet (H200: 41.5 vs
// 22.8 µs; docs/benchmarks.md, "MoE: one token in one launch"), hence off by default. The arithmetic and every
// summation order are the chain's (the same device functions; the partial sums of each row are added in the chain's
// slices and warp order), so the output bits are the chain's: a token's output still does not depend on its batch
// (test_moe_imma checks both).
//
// Counters and flag words live in the first moe_imma_one_counter_bytes of the caller's workspace: zero before the
// first call (moe_imma_workspace_init), and the last block of every call puts them back to zero.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/base/expected.h"
#include "gpu/moe_imma.h"

namespace kestrel::gpu {

// For weights that pass moe_imma_check_weights: true when the one-launch path takes this layer — every expert matrix
// of one type, Q4_0 or Q4_K; an f32 router (H % 4 == 0, 16-byte aligned) of at most 512 experts, an f32 shared-expert
// gate (if any), H <= 4096, I <= 2048, (k + shared) · ⌈I / 256⌉ <= 32.
bool moe_imma_one_supports(const MoeImmaWeights& w);

// Bytes of the counters at the workspace's start (16-aligned; any layer).
size_t moe_imma_one_counter_bytes(const MoeImmaWeights& w);

// Bytes of the path's scratch after the counters.
size_t moe_imma_one_scratch_bytes(const MoeImmaWeights& w);

// One token, for a layer moe_imma_forward has checked and moe_imma_one_supports takes, with the pointers
// moe_imma_forward has checked: x, out device f32 [H] (x 16-byte aligned); counters: moe_imma_one_counter_bytes,
// zero; scratch: moe_imma_one_scratch_bytes, 16-byte aligned (no initialisation). One cooperative launch on
// `stream` (an error if it cannot be enqueued); routing receives the token's routing views (inside scratch).
Status moe_imma_one_forward(const MoeImmaWeights& w, const float* x, float* out, void* counters, void* scratch,
                            cudaStream_t stream, MoeRouting* routing);

}  // namespace kestrel::gpu
