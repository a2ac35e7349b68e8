// moe_imma: the MoE FFN layer on GEMV v4 (gpu/kernels/gemv_imma.h) for n_tok tokens (model-spec.md §5.1;
// ref::moe_forward is the oracle; gpu/kernels/moe_experts.h is the raw-block version it replaces for experts of GEMV
// v4's types).
//
// Weights: the routed experts' gate / up / down stacks re-tiled per expert with tile_matrix (expert e at
// e · tiled_bytes(...) in one buffer per role; the same bytes as the raw stack, reordered), the shared expert's
// three matrices tiled the same way. Gate and up (routed and shared) share one type, down (routed and shared) one
// type, each any type gemv_imma takes (Q4_0, Q4_K, Q5_K, Q6_K, Q8_0: a Q4_K_M file keeps some layers' down matrices in
// Q6_K); the shared expert's ff equals the routed experts' (true of the qwen35moe / qwen3next presets). The router and
// the shared-expert gate stay raw (gpu::gemv's types, gpu/kernels/dequant.cuh's types).
//
// One call, all on one stream, no host synchronisation (launch counts in docs/gpu.md, "MoE layer on GEMV v4"):
//   router logits (an f32 router: with x's preparation, gemv_imma_prepare_x's code, in the same launch; other types:
//   gpu::gemv, then gemv_imma_prepare_x(x)) → the routing (moe_route's code, gpu/kernels/moe_route.cuh: one warp for
//   one token, a warp per token for up to 32 routed entries, one block below 16 tokens, a block per token from 16),
//   which then writes the ImmaSegment tables of gate+up and of down from the routing (per active expert and per chunk
//   of up to C of its tokens one gate, one up and one down segment, plus the shared expert's chunks) →
//   gemv_imma_segments(gate+up) → gemv_imma_prepare_swiglu (SwiGLU per entry, written only in prepared form) →
//   gemv_imma_segments(down) → combine (Σ over each token's entries by ascending expert id of w·y, then +
//   sigmoid(shared gate · x) · shared y, as the reference): 6 launches (7 with a router that is not f32).
// Each active expert's matrices are read once per chunk of C of its tokens (C = MoeImmaTuning::segment_vectors, 2: the
// one-pair GEMV kernel; the later reads mostly from L2). Fixed summation orders and no floating-point atomics:
// repeated runs are bit-identical (given gemv_imma_segments is, as its header says), and a token's outputs do not
// depend on C or on the other tokens of the call.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "gpu/kernels/get_rows.h"     // DeviceMatrixView
#include "gpu/kernels/moe_experts.h"  // MoeDeviceWeights, MoeLaunchInfo
#include "gpu/kernels/moe_hybrid.h"
#include "gpu/kernels/moe_router.h"
#include "gpu/kernels/tuning.h"  // MoeImmaTuning

namespace kestrel::gpu {

// One MoE layer's weights as moe_imma_forward reads them (device pointers, not owned).
struct MoeImmaWeights {
  GgmlType gate_up_type = GgmlType::kQ4_0;  // of the gate and up matrices (routed and shared): gemv_imma's types
  GgmlType down_type = GgmlType::kQ4_0;     // of the down matrices (routed and shared)
  int n_expert_used = 0;                    // k
  int64_t n_embd = 0;                       // H
  int64_t n_ff = 0;                         // I: the routed experts' and the shared expert's ff
  int64_t n_expert = 0;                     // E
  DeviceMatrixView router;                  // ffn_gate_inp {H, E}, raw (gemv_supports)
  const void* gate_exps = nullptr;          // tiled {H, I} × E: expert e at e · tiled_bytes(gate_up_type, H, I)
  const void* up_exps = nullptr;            // tiled {H, I} × E
  const void* down_exps = nullptr;          // tiled {I, H} × E: expert e at e · tiled_bytes(down_type, I, H)
  DeviceMatrixView shared_gate_inp;         // ffn_gate_inp_shexp {H, 1}, raw (gpu/kernels/dequant.cuh types)
  const void* gate_shexp = nullptr;         // tiled {H, I}; null when there is no shared expert
  const void* up_shexp = nullptr;           // tiled {H, I}
  const void* down_shexp = nullptr;         // tiled {I, H}
  bool has_shared_expert() const { return gate_shexp != nullptr; }
};

// True when moe_imma takes raw weights of these shapes and types: gate and up stacks (and a shared expert's gate and
// up) of one type gemv_imma_supports at {H, I}, the down stack (and the shared down) of one type it supports at {I,
// H}, shared ff == I.
Status moe_imma_check_raw(const MoeDeviceWeights& raw);

// kInvalidArgument / kUnsupported naming the role, before anything runs.
Status moe_imma_check_weights(const MoeImmaWeights& w);

// Host-side re-tiling of a stack of n_expert raw GGUF matrices (n_rows rows of n_cols, expert-major, as in the
// file) into out (n_expert · tiled_bytes(type, n_cols, n_rows) bytes): expert e tiled by tile_matrix into
// out[e · tiled_bytes ...] (tile_matrix_stack, over the host's threads). Pure; thread-safe.
Status moe_imma_tile_experts(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, int64_t n_expert,
                             std::span<uint8_t> out);

// Owns the device copies of one layer's tiled expert weights (one allocation); the router and shared-gate views
// point into the raw weights it was built from, which must outlive it. Not copyable; destroy it on a thread
// that may call cudaFree (no stream may still be using it).
class MoeImmaLayer {
 public:
  // Reads the raw gate/up/down stacks (and shared-expert matrices) of `raw` back from the device, tiles them on
  // the host (on its threads) and uploads the tiled forms (synchronous, host-bound). moe_imma_check_raw first.
  static Expected<std::unique_ptr<MoeImmaLayer>> from_raw_device(const MoeDeviceWeights& raw);
  ~MoeImmaLayer();
  MoeImmaLayer(const MoeImmaLayer&) = delete;
  MoeImmaLayer& operator=(const MoeImmaLayer&) = delete;

  const MoeImmaWeights& weights() const { return w_; }
  uint64_t device_bytes() const { return bytes_; }

 private:
  MoeImmaLayer() = default;
  void* base_ = nullptr;  // device, bytes_: gate stack, up stack, down stack, shared gate, up, down (16-aligned)
  uint64_t bytes_ = 0;
  MoeImmaWeights w_;
};

// Bytes of device scratch moe_imma_forward needs for calls of up to n_tok tokens; 0 when n_tok is out of [1,
// kMoeMaxTokens]. The first bytes hold a counter (the spread routing's): zero it once
// (moe_imma_workspace_init) before the workspace's first call; every call leaves them zero, and no call reads the
// rest before writing it.
size_t moe_imma_workspace_bytes(const MoeImmaWeights& w, int n_tok);

// Bytes of those counters (the workspace's first bytes; 16-aligned).
size_t moe_imma_counter_bytes(const MoeImmaWeights& w);

// Zeroes the workspace's counters (cudaMemsetAsync on `stream`). Once per workspace, before its first call.
Status moe_imma_workspace_init(const MoeImmaWeights& w, void* workspace, cudaStream_t stream);

// x: device f32 [n_tok, H], 16-byte aligned; out: device f32 [n_tok, H], not overlapping x. 1 <= n_tok <=
// kMoeMaxTokens. workspace: device, >= moe_imma_workspace_bytes(w, n_tok), 16-byte aligned. Errors before
// anything is enqueued; otherwise the kernels are enqueued on `stream` and the call returns without waiting.
// tuning: the launch forms, segment width and routing kernels (gpu/kernels/tuning.h; they change no bit of the output,
// a forced split of the grouped GEMVs may); its segment_vectors must be in [1, kImmaSegmentVectors]. info (host,
// optional) receives the launch count and the routing views (into the workspace). hooks (optional): run after the
// routing and before the combine (profiling records events there). Thread-safe (no shared state); the caller keeps
// every buffer alive until the stream has run.
Status moe_imma_forward(const MoeImmaWeights& w, const float* x, int n_tok, float* out, void* workspace,
                        cudaStream_t stream, const MoeImmaTuning& tuning = {}, MoeLaunchInfo* info = nullptr,
                        const MoePhaseHooks* hooks = nullptr);

// The router's logits (f32 [n_tok, E]) and x's prepared form (imma_x_bytes(H, n_tok) bytes) of 1..65535 tokens,
// with moe_imma_forward's arithmetic (each logit and each prepared group does not depend on the other tokens): the
// first phase of a layer, for callers that group the tokens of several calls themselves (moe_imma_prompt.h). An f32
// router takes all the tokens in one launch; other routers run gpu::gemv kMoeMaxTokens tokens a call. Enqueues on
// `stream`; returns without waiting.
Status moe_imma_route_inputs(const MoeImmaWeights& w, const float* x, int n_tok, float* logits, void* xprep,
                             cudaStream_t stream);

// The hybrid layer (moe_hybrid.h): w's routed stacks hold only the resident experts (expert id e at slot
// h.resident[e] of each stack; null when none is resident) while n_expert, the router and the routing cover all E;
// the hooks run between the phases. The routing always takes the one-block form (route_table_kernel's, with the split
// and the resident map); the rest is moe_imma_forward's launches over the resident experts' and the shared expert's
// segments (none when neither exists), then the hybrid combine. Same workspace as moe_imma_forward.
Status moe_imma_forward_hybrid(const MoeImmaWeights& w, const MoeHybrid& h, const float* x, int n_tok, float* out,
                               void* workspace, cudaStream_t stream, const MoePhaseHooks& hooks,
                               const MoeImmaTuning& tuning = {}, MoeLaunchInfo* info = nullptr);

}  // namespace kestrel::gpu
