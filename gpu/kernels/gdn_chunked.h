// gdn_chunked: the Gated-DeltaNet layer over one session's T consecutive prompt tokens in the chunked form of the
// delta rule (model-spec.md §3.6; core/reference/delta_rule.h derives it and ref::delta_rule_chunked is its oracle),
// from the outputs of the layer's input projections to the gated-RMSNorm output that feeds ssm_out — what gdn_runs
// computes token after token, as matrix products over chunks of 64 tokens.
//
// Four kernels: (1) per token the conv over (history, prompt), SiLU, the q/k L2 norms and the gates, exactly as
// gdn_runs' prologue (the same helpers, the same order); (2) per (chunk, V-head) the chunk-local matrices — the
// decays e^{G_t − G_s}, A = −strict_lower((β⊙K)Kᵀ ⊙ Γ) and its forward substitution T, U = T(β⊙V), W = T(β⊙K⊙e^G), the
// intra-chunk attention P = lower(QKᵀ ⊙ Γ), Q⊙e^G and K⊙e^{G_last − G}; (3) per (V-head, 32 value columns) the
// recurrence over the chunks in order — V' = U − W S, O = (Q⊙e^G) S + P V', S ← e^{G_last} S + (K⊙e^{G_last−G})ᵀ V'
// (the value columns of S are independent, so a head's state splits over four blocks); (4) per token the gated
// RMSNorm, and the conv history after the last token.
//
// Agreement: f32 throughout with fixed summation orders (runs are bit-identical), but the chunked products round
// differently from the recurrence: test_gdn_runs compares the outputs and the state after the prompt with gdn_runs'
// within a stated tolerance; the conv history is bit-identical.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/base/expected.h"
#include "core/reference/gdn_layer.h"  // ref::GdnProjection
#include "core/reference/gdn_state.h"  // ref::GdnDims
#include "gpu/kernels/gdn_decode.h"    // GdnSlot, GdnDecodeWeights, GdnDecodeInputs

namespace kestrel::gpu {

// True for the shapes gdn_runs serves (gdn_runs_supported: dk, dv <= 128, conv kernels of at most 4 taps).
bool gdn_chunked_supported(const ref::GdnDims& dims);

// Bytes of workspace for prompts of up to max_tokens tokens (0 when dims are not supported or max_tokens < 1).
size_t gdn_chunked_workspace_bytes(const ref::GdnDims& dims, int max_tokens);

// n_tok tokens of one session: rows 0 .. n_tok − 1 of `in` in position order; slot: that session's state (S and the
// conv history, read and written); w, in, out and projection as gdn_runs. workspace: 16-byte aligned, at least
// gdn_chunked_workspace_bytes(dims, n_tok). Argument errors come before anything is enqueued (kUnsupported where
// gdn_chunked_supported is false); otherwise four kernels are enqueued on `stream` and the call returns without
// waiting. Thread-safe where concurrent calls have their own workspaces and slots.
Status gdn_chunked(const ref::GdnDims& dims, ref::GdnProjection projection, const GdnDecodeWeights& w,
                   const GdnDecodeInputs& in, const GdnSlot& slot, int n_tok, float* out, void* workspace,
                   cudaStream_t stream);

}  // namespace kestrel::gpu
