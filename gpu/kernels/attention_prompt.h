// attention_prompt: the gated causal attention of a prompt's rows of one session (model-spec.md §4; ref::attn_forward
// is the oracle, attention_decode.h the kernel for decode rows), once attention_kv_append_device has put every row's
// K and V into the cache.
//
// One block per (kv head, tile of QR consecutive rows): the tile's rows × the kv head's G query heads (QR · G <= 32
// query vectors, normed and roped into shared memory) against the cache in tiles of 32 positions staged in shared
// memory, so each K and V row is read once per row tile instead of once per row. Per position tile: scores s[q][t] =
// q · K[t] · scale (4 a thread, fixed-order dots), masked past each row's own position; the online softmax of each
// query (a warp per query, lane = position); acc[q][i] = acc[q][i] · corr_q + Σ_t p[q][t] V[t][i] (t in order, the
// accumulators in registers). Then out = acc / l ⊙ sigmoid(gate), and with out_prepared the rows' prepared form for
// gemv_imma (head_dim a multiple of 256). The decode kernel's arithmetic per tile, with one split of the positions
// (tiles of 32 from 0) where the decode kernel splits each row's positions into chunks it merges: the results agree
// with attention_decode's to f32 rounding (test_attention_prompt: 1e-5 of max|V|), not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"
#include "gpu/kernels/attention_decode.h"  // AttnDecodeDims, AttnDecodeArgs
#include "gpu/memory/state_slots.h"        // KvPageTable

namespace kestrel::gpu {

// True when attention_prompt takes these dims: head_dim one of 32, 64, 128, 256 (a column per thread or a few
// queries a thread), n_head / n_head_kv <= 32, n_rot <= head_dim.
bool attention_prompt_supports(const AttnDecodeDims& dims);

// n_rows rows of slot `slot` at positions pos0, pos0 + 1, … (already appended): args.qg (+ qg_stride), q_norm,
// rope_inv_freq, out and out_prepared as attention_decode_device reads them, one row per prompt row; the k / v /
// slot / position fields are not read. The slot's pages of positions [0, pos0 + n_rows) are in cache.pages. Errors
// (kInvalidArgument, kUnsupported where attention_prompt_supports is false) before the launch; otherwise one kernel
// is enqueued and the call returns without waiting.
Status attention_prompt(const AttnDecodeDims& dims, const KvPageTable& cache, const AttnDecodeArgs& args, int n_rows,
                        int32_t slot, int32_t pos0, cudaStream_t stream);

}  // namespace kestrel::gpu
