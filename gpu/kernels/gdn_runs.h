// gdn_runs: the Gated-DeltaNet layer over runs of consecutive tokens of one session each — a prompt's chunk, or
// a decode token as a run of one — from the outputs of the layer's input projections to the gated-RMSNorm output
// that feeds ssm_out (model-spec.md §3; the same math as gdn_decode, gpu/kernels/gdn_decode.h).
//
// A pass's rows are tokens; run r names rows order[start[r]], …, order[start[r] + len[r] − 1], the tokens of one
// session in position order, and the session's state slot is slots[order[start[r]]]. One block of the per-V-head
// kernel's shape (512 threads, all of S_h in registers) per (V-head, run) loads S_h and the conv history once, runs
// the run's tokens one after the other — each with exactly the per-V-head decode kernel's arithmetic in its order —
// and stores S_h and the history once. So every token's output, and the state after the run, are bit-identical to
// gdn_decode called once per token (test_gdn_runs): a session's bits do not depend on how its prompt was cut into
// runs or on the other runs of the pass, and the state is read and written once per run instead of once per token.
// The q/k history of a K-head is read by the r V-head blocks of that K-head; the last of them to count (the
// workspace's counter per (run, K-head), as gdn_decode's) writes it back.
//
// It serves the shapes gdn_decode runs on its per-V-head kernel (dk, dv <= 128: every preset) with conv kernels of
// at most 4 taps (gdn_runs_supported); elsewhere callers run a token per call of gdn_decode.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/base/expected.h"
#include "core/reference/gdn_layer.h"  // ref::GdnProjection
#include "core/reference/gdn_state.h"  // ref::GdnDims
#include "gpu/kernels/gdn_decode.h"    // GdnSlot, GdnDecodeWeights, GdnDecodeInputs
#include "gpu/kernels/tuning.h"        // GdnDecodeTuning

namespace kestrel::gpu {

// The runs of a pass, on the device: run r covers order[start[r] .. start[r] + len[r]); len[r] = 0 marks an unused
// entry (its blocks return at once), so a captured launch serves any split of its rows into runs.
struct GdnRunTable {
  const int32_t* start = nullptr;  // int32 [n_entries]
  const int32_t* len = nullptr;    // int32 [n_entries]
  const int32_t* order = nullptr;  // int32 [rows]: row indices, each run's in position order
};

// True when gdn_runs takes dims: gdn_decode would run them on its per-V-head kernel under `tuning`, and the conv
// kernel has at most 4 taps.
bool gdn_runs_supported(const ref::GdnDims& dims, const GdnDecodeTuning& tuning = {});

// Bytes of workspace for n_entries run entries: the same counters as gdn_decode_workspace_bytes(dims, n_entries)
// (zero before the first call, left zero by every call), so one workspace serves both kernels in stream order.
size_t gdn_runs_workspace_bytes(const ref::GdnDims& dims, int n_entries);

// dims, projection, w, in, out: as gdn_decode, with `in` and `out` holding one row per token of the pass. slots:
// device [rows] (a run reads the entry of its first row; the runs' states distinct). runs: n_entries entries
// (1..65535), every run's rows distinct from every other's and positions consecutive in the order given (the
// caller's guarantee: the table is device data). Argument errors (kInvalidArgument, kUnsupported where
// gdn_runs_supported is false) come before anything is enqueued; otherwise one kernel is enqueued on `stream` and
// the call returns without waiting. Thread-safe where concurrent calls have their own workspaces.
Status gdn_runs(const ref::GdnDims& dims, ref::GdnProjection projection, const GdnDecodeWeights& w,
                const GdnDecodeInputs& in, const GdnSlot* slots, const GdnRunTable& runs, int n_entries, float* out,
                void* workspace, cudaStream_t stream, const GdnDecodeTuning& tuning = {});

}  // namespace kestrel::gpu
