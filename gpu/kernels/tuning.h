// GpuTuning: the choices between kernels (or launch forms) of an op that do not follow from its shapes alone. The CUDA
// engine fixes one when it builds its forward pass (gpu/engine/forward_pass.h, from CudaEngineOptions) and passes its
// parts to the kernel entry points; tests and benchmarks construct one to force a path. The member initializers are
// the engine's path; each field says what it chooses and why that default (figures: bench_gemv / bench_moe /
// bench_gdn on the H200; the history of each choice: dev/notes/gpu-kernels.md).
//
// Plain values without CUDA types, so cuda_engine.h can carry one. Nothing here is process-wide: two calls with
// different tunings may run side by side.
#pragma once

namespace kestrel::gpu {

// The activation digits gemm_imma multiplies (gpu/kernels/gemm_imma.h): all four, or the first two.
enum class GemmDigits { kFour = 4, kTwo = 2 };

// GEMV v4 (gemv_imma, gemv_imma_segments; gpu/kernels/gemv_imma.h).
struct GemvImmaTuning {
  // Warps per row group (S, the slices a row is split into). 0: the split by shape (gemv_imma.cu's pick_split), which
  // the results are tested with. > 0 forces S (rounded down to a power of two, at most 16) for benchmark sweeps; the
  // results stay within the same bound, but their bits depend on S.
  int split = 0;
  // Dense calls at one group per warp run the flat kernel (no rounds, nothing loaded ahead: the <= 9.4 MB projections
  // in one wave, 82.6% -> 89.5% of a size-matched read at batch 1). false runs them on the persistent kernel, for the
  // test that both give the same bits.
  bool flat_kernel = true;
  // Slices of 2, 4 or 8 groups run kernels with that count compiled in (a round's groups unroll into immediate
  // offsets: about a sixth fewer instructions per MMA). false reads the count at run time everywhere, for the tests
  // that both give the same bits.
  bool compiled_groups = true;
  // Prompt passes (ForwardPass::run_prompt: more than 32 vectors a projection, the MoE grouped over all tokens) run
  // gemm_imma where it takes the type (every type gemv_imma tiles): each weight tile decoded once for 8 vectors and 64
  // rows a warp. false keeps GEMV v4 there, for A/B measurements (bench_engine --no-prompt-gemm).
  bool prompt_gemm = true;
  // The activation digits gemm_imma multiplies in prompt passes (gemm_imma.h: 4, or 2 for half the MMAs and scalings at
  // 13 bits below each group's bound). Decode always multiplies four.
  GemmDigits prompt_digits = GemmDigits::kFour;
};

// The MoE layer on GEMV v4 (moe_imma_forward; gpu/kernels/moe_imma.h). No field changes a result bit.
struct MoeImmaTuning {
  // Calls of up to this many tokens launch every kernel after the first as a programmatic dependent of the kernel
  // before it (gpu/kernels/pdl.cuh); larger calls only the spread routing, the down GEMV and the combine. Chaining the
  // whole layer is faster at 1-4 tokens and slower at 8-32. 0: only those three at every size; kMoeMaxTokens: every
  // launch of every call.
  int programmatic_max_tokens = 4;
  // Vectors per segment of the grouped GEMVs, 1..kImmaSegmentVectors: an expert chosen by more tokens is read once per
  // chunk of this many. At 2 every call runs the one-pair GEMV kernel, which beats wider segments on the wider kernels
  // (8 tokens 56 against 78 µs at 8, 32 tokens 150 against 201).
  int segment_vectors = 2;
  // From this many tokens the routing runs in a block per token and the last block to finish writes the segment
  // tables; below it one block (or one warp) does all of it (one block is issue-bound from 16 tokens). kMoeMaxTokens
  // + 1: never.
  int route_spread_min_tokens = 16;
  // Calls of at most 32 routed entries (n_tok · k) are routed by a warp per token and grouped by one warp, without the
  // one-block kernel's barriers and scans over 1024 threads (about 2 µs less at one token). false runs them on the
  // one-block kernel, for the test that both write the same tables.
  bool route_by_warp = true;
  // The layer's two grouped GEMVs (gemv_imma_segments).
  GemvImmaTuning grouped_gemv;
  // Vectors per segment of a prompt pass's MoE calls (moe_imma_prompt.h), 1..kImmaSegmentVectors: there an expert has
  // tens of tokens, and 8 reads each expert a quarter as often as 2 (pp512 on the H100: MoE layers 51 against 62 ms).
  int prompt_segment_vectors = 8;
};

// The kernels of gdn_decode (gpu/kernels/gdn_decode.h).
enum class GdnKernel {
  kAuto,  // gdn_decode's choice by shape (a setting of GdnDecodeTuning, never a kernel)
  kPerHead,
  kTwoKernel,
};

// The GDN decode step (gdn_decode).
struct GdnDecodeTuning {
  // kAuto: the per-V-head kernel where dk, dv <= 128 (every preset), else the two-kernel path — one kernel per shape
  // at every batch size, so a session's bits do not depend on its batch. kTwoKernel runs the two-kernel path on every
  // shape (kPerHead where it serves: the automatic choice), so tests can run both kernels on one problem.
  GdnKernel kernel = GdnKernel::kAuto;
  // Prompt passes (more than 32 tokens of one session) run the chunked delta rule (gdn_chunked.h): chunks of 64 tokens
  // as matrix products instead of gdn_runs' token after token. false keeps gdn_runs there, for A/B measurements
  // (bench_engine --no-prompt-chunked) and for bit-identity with token-by-token decode.
  bool prompt_chunked = true;
};

// GpuTuning::expert_upload_min_tokens: chosen by the placed engine's cost model; and the threshold that model falls
// back to when it cannot measure, the crossover measured on the lent H100 box (GpuTuning below).
inline constexpr int kExpertUploadAuto = -1;
inline constexpr int kExpertUploadMeasuredTokens = 160;

// GpuTuning::expert_side_read: chosen by the placed engine's cost model.
inline constexpr float kSideReadAuto = -1.0f;

// Everything the engine fixes for its life.
struct GpuTuning {
  // The projections (gemv_imma, gemv_imma_prepare_swiglu) and the GDN step launch as programmatic dependents of the
  // kernel before them: their launch and first weight loads overlap that kernel's end, the bits are the same. false
  // for A/B measurements (bench_engine --no-pdl).
  bool programmatic = true;
  GemvImmaTuning gemv_imma;  // the dense projections
  MoeImmaTuning moe_imma;
  GdnDecodeTuning gdn_decode;
  // Prompt passes of at least this many tokens copy the routed experts hybrid layers keep in host memory to the GPU
  // and run those layers there (gpu/engine/expert_upload.h); shorter ones hand the host its experts' tokens. 0: never.
  // kExpertUploadAuto: hybrid/placed_cuda_engine.h sets it from its cost model (a pass's upload at the measured
  // page-locked copy rate against the host's measured time per prompt token); an engine made directly never uploads.
  // On the lent H100 box (bench_engine --pp 128,256,512 with --expert-upload 1 and 0, 2026-12-07) every expert on the
  // CPU gave 387 / 774 / 1544 against 459 / 494 / 523 tokens/s and a 12 GiB budget 931 / 1778 / 3205 against 1075 /
  // 1177 / 1267: an upload cost a fixed ~330 (~137) ms, the host ~1.9 (~0.8) ms a token, crossing near 155 tokens.
  int expert_upload_min_tokens = kExpertUploadAuto;
  // Decode steps of hybrid layers whose host experts are page-locked read this share of each token's host choices
  // over the bus themselves (the side read, gpu/kernels/moe_hybrid.h step 3b) while the host's workers read the
  // rest; 0: never. kSideReadAuto: hybrid/placed_cuda_engine.h sets it from the measured rates (the GPU's read of
  // mapped page-locked memory against the host's read); an engine made directly never reads over the bus.
  float expert_side_read = kSideReadAuto;
};

}  // namespace kestrel::gpu
