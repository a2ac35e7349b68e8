// gdn_decode: one Gated-DeltaNet decode step (one token) for a batch of sessions, each with its own state slot,
// from the outputs of the layer's input projections to the gated-RMSNorm output that feeds ssm_out
// (model-spec.md §3; core/reference/gdn_layer.cpp, GdnMode::kRecurrent, is the oracle).
//
// Per session n and V-head h (kh = ref::gdn_k_head(dims, h): grouped h / r for qwen3next, tiled h % Kh for qwen35*):
//   u          = silu(causal_conv(history, mixed_qkv))      history ← last K−1 raw inputs   (gdn_conv.h)
//   q̂, k̂, v    = l2norm(q_kh)·(1/sqrt(dk)), l2norm(k_kh), v_h (eps 1e-6)                   (gdn_prepare.h)
//   beta, g    = sigmoid(b_h), ssm_a_h · softplus(a_h + dt_bias_h)
//   S_h        ← e^g S_h;  δ = (v − S_hᵀk̂)·beta;  S_h ← S_h + k̂ δᵀ;  o = S_hᵀq̂                  (delta_rule.h)
//   out_h      = rms_norm(o)·ssm_norm · silu(z_h)                                           (norm.h, §3.7)
// The qwen3next fused projections are de-interleaved on the fly by index arithmetic (ref::gdn_deinterleave_qkvz,
// ref::gdn_split_ba): the inputs are exactly what the projection GEMVs produce for the layer's ref::GdnProjection.
//
// State per session (the layout of ref::GdnState, so a slot filled from the reference plugs in unchanged):
//   s    f32 [Vh][dk][dv]  S_h[i][j] at (h·dk + i)·dv + j
//   conv f32 [C][K−1]      raw mixed_qkv history per channel, oldest first
// Two kernels serve it (GdnKernel; gdn_decode picks by shape alone, so a session's bits never depend on its batch):
//   kPerHead   a block of 512 threads per (session, V-head) holding all of S_h in registers, the gated norm inside
//              the block; the last of a K-head's r blocks to read its q/k history (a counter in the workspace)
//              shifts it. Where dk, dv <= 128: every preset, and the path the engine takes.
//   kTwoKernel the step writing o into `out` (a block per 32 columns of a V-head), then the gated norm per (session,
//              V-head) in place, which also shifts the q/k history. Every shape up to kGdnMaxDk.
// Fixed summation orders and no floating-point atomics, so repeated runs are bit-identical; the kernels differ from
// each other in summation order only. docs/gpu.md ("GDN decode step") has details.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/base/expected.h"
#include "core/reference/gdn_layer.h"  // ref::GdnProjection
#include "core/reference/gdn_state.h"  // ref::GdnDims
#include "gpu/kernels/tuning.h"        // GdnKernel, GdnDecodeTuning

namespace kestrel::gpu {

// Largest d_k the delta-rule kernel holds in registers (8 row groups × 32 rows per thread).
inline constexpr int kGdnMaxDk = 256;

// One session's state slot: device pointers into whatever owns the state (a state-slot pool, a test buffer).
struct GdnSlot {
  float* s = nullptr;     // f32 [Vh][dk][dv], 16-byte aligned not required
  float* conv = nullptr;  // f32 [C][K−1]
};

// One GDN layer's small f32 tensors, on the device.
struct GdnDecodeWeights {
  const float* conv1d = nullptr;    // ssm_conv1d.weight f32 [C][K]
  const float* dt_bias = nullptr;   // ssm_dt.bias f32 [Vh]
  const float* ssm_a = nullptr;     // ssm_a f32 [Vh] (= −exp(A_log), as stored in GGUF)
  const float* ssm_norm = nullptr;  // ssm_norm.weight f32 [dv]
};

// The input-projection outputs of the n_seq tokens (one per session), on the device. Which fields are read depends
// on the projection layout:
//   kQkvGateBetaAlpha (qwen35*):      qkv f32 [n_seq, C], z f32 [n_seq, Vd], b f32 [n_seq, Vh], a f32 [n_seq, Vh]
//   kQkvGateBa        (qwen3next):    qkv f32 [n_seq, C], z f32 [n_seq, Vd], ba f32 [n_seq, 2·Vh] (per K-group)
//   kSsmInBa          (legacy qwen3next): qkv f32 [n_seq, C + Vd] = HF in_proj_qkvz (per K-group [q|k|v|z]),
//                                       ba f32 [n_seq, 2·Vh]; z unused
struct GdnDecodeInputs {
  const float* qkv = nullptr;
  const float* z = nullptr;
  const float* b = nullptr;
  const float* a = nullptr;
  const float* ba = nullptr;
  // 0: each buffer holds dense rows of its own width (above). > 0: every buffer's session rows are this many floats
  // apart — the layout of one GEMV over the projections stacked row-wise (qkv, z, b, a as column ranges of one
  // [n_seq, row_stride] output).
  int row_stride = 0;
};

// Bytes of device scratch gdn_decode needs for n_seq sessions: u32 [n_seq][Kh] counters (the per-V-head kernel's
// readers of each K-head's q/k history), then u32 [n_seq][⌈Vd/256⌉] (the heads that have written each 256-column
// group of the output, for out_prepared). It must be zero before its first call (cudaMemset once); every call
// leaves it zero, so it serves later calls with up to that many sessions, of any layer with the same Kh, one call
// at a time — and nothing else may write it.
size_t gdn_decode_workspace_bytes(const ref::GdnDims& dims, int n_seq);

// dims: must validate(), with conv_kernel >= 1 and d_k <= kGdnMaxDk. slots: device array [n_seq] of GdnSlot
// (distinct, non-overlapping states). out: device f32 [n_seq, Vd] (the gated-norm output, input of ssm_out); it
// must not overlap the inputs. workspace: device, >= gdn_decode_workspace_bytes(dims, n_seq), 16-byte aligned,
// zero before the first call (above). n_seq >= 0 (0 launches nothing). Argument errors (kInvalidArgument naming the
// field) are found before anything is enqueued; otherwise gdn_kernel_launches(gdn_decode_kernel(dims, tuning))
// kernels are enqueued on `stream` and the call returns without waiting.
// Thread-safe where concurrent calls have their own workspaces (a workspace serves one call at a time, in stream
// order); the caller keeps every buffer alive until the stream has run, and no other work may touch the slots
// meanwhile.
// programmatic: where the step is one kernel (kPerHead), it is launched as a programmatic dependent of the
// kernel before it on `stream` (gpu/kernels/pdl.cuh) and loads its slot pointers and S slices before it waits for that
// kernel: the slot array and the states must not be written by any kernel that may still be running (in a decode
// step a layer's states are written only by its own step, a decode step apart). The inputs, the output, the history
// and the workspace are touched after the wait, and the results are the same bits. The two-kernel path launches
// plainly either way (chained, it gained nothing at 8 sessions and lost 4% at 32).
// tuning: the kernel by shape unless it names one (gpu/kernels/tuning.h).
// out_prepared: null, or device imma_x_bytes(value_dim, n_seq) bytes (16-byte aligned, and out too) that receive the
// prepared form of out for gemv_imma (gemv_imma_prepare_x's bytes): the per-V-head kernel writes it in the same launch
// (each 256-column group by the block that finishes it last), the two-kernel path by one more launch.
Status gdn_decode(const ref::GdnDims& dims, ref::GdnProjection projection, const GdnDecodeWeights& w,
                  const GdnDecodeInputs& in, const GdnSlot* slots, int n_seq, float* out, void* workspace,
                  cudaStream_t stream, bool programmatic = false, const GdnDecodeTuning& tuning = {},
                  void* out_prepared = nullptr);

// The kernel gdn_decode takes for dims under `tuning`, at every batch size (never kAuto). Errors: dims gdn_decode
// would refuse (kInvalidArgument). Thread-safe.
Expected<GdnKernel> gdn_decode_kernel(const ref::GdnDims& dims, const GdnDecodeTuning& tuning = {});

// Kernels one call on `kernel` enqueues (2 for kTwoKernel, else 1), and its name for reports.
int gdn_kernel_launches(GdnKernel kernel);
const char* gdn_kernel_name(GdnKernel kernel);

}  // namespace kestrel::gpu
