// Gated full-attention decode on the device: one new token for each of a batch of sessions (model-spec.md §4).
//
// Between the q/k/v GEMVs and the output GEMV of an attention layer, for each sequence b (slot slot_ids[b], the
// new token at position positions[b] = the number of tokens already in that slot's cache), exactly as
// ref::attn_forward does for one token:
//   q_h, gate_h = qg[b][h·2hd, h·2hd+hd), qg[b][h·2hd+hd, (h+1)·2hd)          ([q | gate] per head)
//   q_h = rms_norm(q_h) · q_norm;  k_j = rms_norm(k_j) · k_norm               (eps, over all hd dims)
//   partial NeoX RoPE on dims [0, n_rot) of q_h and k_j at positions[b]       (pairs (i, i + n_rot/2))
//   cache K[pos] = k (normed, roped), V[pos] = raw v                          (the slot's KV pages, state_slots.h)
//   attn_h = softmax(q_h · K[0..pos] · scale) V[0..pos] over kv head h / (n_head / n_kv)      (GQA)
//   out[b][h·hd + i] = attn_h[i] · sigmoid(gate_h[i])                         (input of the attn_output GEMV)
// RoPE angles: θ_i = (float)pos · inv_freq[i] with inv_freq the table ref::rope_inv_freq computes on the host
// (uploaded by the caller once per model), so the angles are bit-identical to the reference's; cosf/sinf, expf and
// the f32 sums differ from the host's by a few ulps.
//
// The cache is paged (KvPageTable, gpu/memory/state_slots.h): position p of a slot lives in page
// pages[slot][p / page_size] at row p % page_size, so every row load first reads the slot's page table (a few
// cached int32s a tile). Which page holds a row changes where it is read from, never what is computed: the results
// are the bits of a contiguous cache, whatever the pages' order in the pool. The page a sequence appends to must be
// in its table before the call (kv_page_publish below, or the StateSlots copy functions).
//
// Work split (flash-decoding over GQA groups): a sequence's positions [0, pos] are cut into
// n = min(pos / chunk + 1, max_chunks) chunks of ceil((pos + 1) / n) positions; one block per (kv head, sequence,
// chunk) serves all n_head / n_kv query heads of that kv head, so every K and V row is read from memory once per
// step (not once per query head). The block stages its chunk in tiles of 8-32 positions in shared memory (all 8
// warps load a tile at once, so many rows are in flight) and runs a stable online softmax per head in f32, the
// sums in a fixed order. A sequence of one chunk is finished by that block; longer ones leave (max, sum,
// unnormalised accumulator) per head and chunk in `workspace` and a second kernel merges the chunks in order. The
// split depends only on the sequence's own position and dims.chunk / max_chunks, never on the other sequences of
// the batch or on the page size, so a session's output is bit-identical whether it runs alone or in any batch;
// there are no atomics, so repeated runs are bit-identical too. Results agree with the reference to ~1e-5 relative.
//
// Launches: one kernel appends k/v (grid n_kv × n_seq), one attends (grid n_kv × n_seq × max chunks, the group's q
// normed and roped in shared memory by each block), and, when some sequence spans more than one chunk or the output's
// prepared form is asked for (out_prepared), one merges (and prepares).
// head_dim <= 512. Returns without waiting; argument errors (kInvalidArgument, kOutOfRange for a position outside
// the table's capacity, duplicate slots, a missing or small workspace) are found from the host copies of slot ids
// and positions before anything is launched, and leave the caches untouched. Thread-safe (no shared state); the
// caller keeps every buffer alive until the stream has run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "core/base/expected.h"
#include "gpu/memory/state_slots.h"  // KvPageTable

namespace kestrel::gpu {

inline constexpr int kAttnDecodeMaxHeadDim = 512;

struct AttnDecodeDims {
  int n_head = 0;        // query heads
  int n_head_kv = 0;     // key/value heads; n_head is a multiple
  int head_dim = 0;      // hd, 1..kAttnDecodeMaxHeadDim
  int n_rot = 0;         // even, <= head_dim
  float eps = 1e-6f;     // q/k RMSNorm eps
  int chunk = 32;        // least positions per attention block (>= 1); with max_chunks part of the numerics: keep
                         // both fixed per model
  int max_chunks = 256;  // most blocks per (head, sequence), 1..65535
};

struct AttnDecodeArgs {
  const float* qg = nullptr;             // device f32 [n_seq, n_head·2·hd]  attn_q GEMV output
  const float* k = nullptr;              // device f32 [n_seq, n_kv·hd]      attn_k GEMV output
  const float* v = nullptr;              // device f32 [n_seq, n_kv·hd]      attn_v GEMV output
  const float* q_norm = nullptr;         // device f32 [hd]
  const float* k_norm = nullptr;         // device f32 [hd]
  const float* rope_inv_freq = nullptr;  // device f32 [n_rot/2] = ref::rope_inv_freq(n_rot, freq_base); may be null
                                         // when n_rot == 0
  const int32_t* slot_ids = nullptr;     // device int32 [n_seq], distinct
  const int32_t* positions = nullptr;    // device int32 [n_seq]
  float* out = nullptr;                  // device f32 [n_seq, n_head·hd]
  float* workspace = nullptr;            // device scratch, needed when a position >= dims.chunk; may be null else
  size_t workspace_bytes = 0;
  // Floats from one sequence's row of qg to the next, and of k (and v) to the next: 0 for rows packed as above, or the
  // width of a stacked projection whose output rows hold q|gate, k and v side by side.
  int64_t qg_stride = 0;
  int64_t kv_stride = 0;
  // Null, or device imma_x_bytes(n_head·hd, n_seq) bytes (16-byte aligned, and out too) that receive out's prepared
  // form for gemv_imma (gemv_imma_prepare_x's bytes), written by the merge kernel, which then runs for every call;
  // only where attention_prepares_out(dims).
  void* out_prepared = nullptr;
};

// Whether attention_decode can write its output's prepared form (AttnDecodeArgs::out_prepared): head_dim a multiple
// of 256 (each head's columns whole groups of the prepared form) and an output row gemv_imma takes.
bool attention_prepares_out(const AttnDecodeDims& dims);

// Workspace bytes that suffice for any call with up to n_seq sequences on caches of n_ctx tokens.
size_t attention_decode_workspace_bytes(const AttnDecodeDims& dims, int n_seq, int n_ctx);

// slot_ids_host / positions_host: the same values as args.slot_ids / args.positions (n_seq = their size); each
// slot id in [0, n_slots) and each position in [0, cache.capacity()). cache: the layer's view of the page pool
// (from StateSlots::kv_table; its n_head_kv and head_dim must equal dims'); every page of positions [0, pos] of
// each sequence in its slot's device table. n_slots: the number of slots the table has rows for.
Status attention_decode(const AttnDecodeDims& dims, const KvPageTable& cache, int n_slots, const AttnDecodeArgs& args,
                        std::span<const int32_t> slot_ids_host, std::span<const int32_t> positions_host,
                        cudaStream_t stream);

// The same launches for a call captured once and replayed (a CUDA graph): slot ids and positions are read only from
// the device, and the launch shape comes from n_seq and max_position, a bound on every position (e.g. the slots'
// n_ctx − 1): blocks past a sequence's own chunks return at once, so the results are the bits attention_decode gives.
// The page tables are data too (read by the kernels), so a replay follows whatever pages the slots hold then. Rows
// of one slot at consecutive positions (a prompt's tokens in one pass) are allowed: every row's K/V is appended
// before any row attends, so each row sees positions [0, its own] as it would a token at a time, with the same bits
// (the split depends on the position alone). Otherwise the caller guarantees what attention_decode checks on the
// host copies (slots in range, positions in [0, min(max_position, cache.capacity() − 1)]) and that the pages are in
// the table; the workspace must hold attention_decode_workspace_bytes(dims, n_seq, max_position + 1).
Status attention_decode_device(const AttnDecodeDims& dims, const KvPageTable& cache, const AttnDecodeArgs& args,
                               int n_seq, int max_position, cudaStream_t stream);

// The K/V append of attention_decode_device alone (its first kernel): K[pos] = RoPE(rms_norm(k) · k_norm), V[pos] = v
// for each of the n_seq rows (a.k, a.v, a.kv_stride, a.k_norm, a.rope_inv_freq, a.slot_ids, a.positions; the rest of
// a is not read), the same bits as that kernel. For attention_prompt (attention_prompt.h), which attends once every
// row of a prompt pass is in the cache. One launch; returns without waiting.
Status attention_kv_append_device(const AttnDecodeDims& dims, const KvPageTable& cache, const AttnDecodeArgs& args,
                                  int n_seq, cudaStream_t stream);

// Writes page_ids[b] into slot slot_ids[b]'s page table at the entry of positions[b] (table.pages[slot_ids[b] ·
// max_pages + positions[b] / page_size]) for b < n_seq, all from device memory: the page a decode pass appends each
// sequence's token to, published once per pass for every attention layer (they share the table). One launch of one
// block; idempotent (the forward pass publishes a row's page with every position it writes, not only the first).
// The caller guarantees slot ids in range and distinct, positions below table.capacity() and page ids in the pool;
// table.k / table.v are not used. Returns without waiting.
Status kv_page_publish(const KvPageTable& table, const int32_t* slot_ids, const int32_t* positions,
                       const int32_t* page_ids, int n_seq, cudaStream_t stream);

}  // namespace kestrel::gpu
