// moe_imma_forward (see moe_imma.h): the MoE layer on GEMV v4's grouped form (gemv_imma_segments).
//
// Rows ("entries") of the per-call scratch: routed entry i (moe_route's order: by expert, then token) is row i;
// with a shared expert, token t's shared row is n_entries + t; n_all rows in all. Gate+up results go to gu
// f32 [2 · n_all, I] (gate row r at r, up row r at n_all + r), the SwiGLU activations only in their prepared form
// (gemv_imma_prepare_swiglu, one vector per row), the down results to ye f32 [n_all, H].
//
// Segment tables (written by the routing kernel right after it routes — route_table_one_kernel,
// route_table_warp_kernel, route_table_kernel or route_spread_table_kernel by the call's size, the same bytes from
// each; read by gemv_imma_segments):
//   gate+up: [shared chunk c: gate, up]·sh_chunks, then per routed chunk q (active experts ascending, each expert's
//            entries in chunks of C = the call's vectors per segment): gate, up;
//   down:    [shared chunk c]·sh_chunks, then routed chunk q;
// then, from kCountedTablesMinTokens tokens, the counts of both (n_used, which the GEMVs read: the rest of each table
// is not written); below it, empty segments (n_vec = 0) to the tables' capacity.
// The routed chunk positions come from an exclusive scan of ⌈count/C⌉ over the experts (write_tables). Capacity:
// Σ ⌈c_e/C⌉ <= Σ (1 + ⌊c_e/C⌋) <= n_active + ⌊n_entries/C⌋, and <= n_entries (the workspace holds C = 1's).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <cub/block/block_scan.cuh>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/moe_combine.cuh"
#include "gpu/kernels/moe_experts.h"
#include "gpu/kernels/moe_hybrid.h"
#include "gpu/kernels/moe_imma.h"
#include "gpu/kernels/moe_route.cuh"
#include "gpu/kernels/moe_router_logits.cuh"
#include "gpu/kernels/pdl.cuh"
#include "gpu/memory/scratch_carve.h"
#include "gpu/memory/tiled_matrix.h"

namespace kestrel::gpu {
namespace {

constexpr int kCombineThreads = moe_combine::kThreads;
using moe_router_logits::kRouterStageMinTokens;
using moe_router_logits::kRouterTokens;
using moe_router_logits::kRouterWarps;
using moe_router_logits::kTileStageBytes;
using moe_router_logits::router_blocks_of;
using moe_router_logits::router_logits_block;
using moe_router_logits::router_logits_tile;
using moe_router_logits::router_stage_bytes;
using moe_router_logits::router_tile_blocks_of;
using moe_router_logits::router_tile_takes;

// From this many tokens the segment tables are counted: the table writer leaves how many segments each holds and the
// grouped GEMVs read only those (n_used); below, it fills the tables' unused tail with empty segments, which the GEMVs
// walk. Counted tables skip the empty tail of a worst-case-sized table (~20% of it at 32 tokens), and the counted
// GEMVs take their items in one run per block, which keeps a segment's activations in L1: faster from 2 tokens
// (2 tokens 27.0 -> 25.7 µs). One token's table has no tail (its k experts and the shared expert fill it): it stays
// uncounted.
constexpr int kCountedTablesMinTokens = 2;

// The workspace's first bytes: route_spread_table_kernel's arrival counter, padded to 256 bytes so that what follows
// keeps the allocation's alignment.
constexpr size_t kChainCounterBytes = 256;

std::string tname(GgmlType t) { return std::string(ggml_type_name(t)); }

// Sizes of one call.
struct Counts {
  int chunk = kImmaSegmentVectors;  // vectors per segment at most
  int n_tok = 0;
  int n_entries = 0;   // n_tok · k
  int n_all = 0;       // n_entries + (shared ? n_tok : 0)
  int max_active = 0;  // min(E, n_entries)
  int max_chunks = 0;  // routed chunks of <= 8 entries, at most
  int sh_chunks = 0;   // shared expert's chunks of <= 8 tokens
  int n_seg_gu() const { return 2 * (sh_chunks + max_chunks); }
  int n_seg_dn() const { return sh_chunks + max_chunks; }
};

// chunk: the call's vectors per segment; the workspace is laid out for chunk 1 (the most segments).
Counts counts_of(const MoeImmaWeights& w, int n_tok, int chunk) {
  Counts c;
  c.chunk = chunk;
  c.n_tok = n_tok;
  c.n_entries = n_tok * w.n_expert_used;
  c.n_all = c.n_entries + (w.has_shared_expert() ? n_tok : 0);
  c.max_active = static_cast<int>(std::min<int64_t>(w.n_expert, c.n_entries));
  c.max_chunks = std::min(c.n_entries, c.max_active + c.n_entries / chunk);
  c.sh_chunks = w.has_shared_expert() ? (n_tok + chunk - 1) / chunk : 0;
  return c;
}

// Workspace pieces, in order.
struct Layout {
  float* logits = nullptr;        // f32 [n_tok, E]
  void* routing = nullptr;        // moe_routing_bytes
  uint8_t* xprep = nullptr;       // imma_x_bytes(H, n_tok)
  ImmaSegment* seg_gu = nullptr;  // [n_seg_gu]
  ImmaSegment* seg_dn = nullptr;  // [n_seg_dn]
  float* gu = nullptr;            // f32 [2 · n_all, I]
  uint8_t* aprep = nullptr;       // n_all prepared vectors of I
  float* ye = nullptr;            // f32 [n_all, H]
  int32_t* n_used = nullptr;      // [2]: the tables' segments in use (gate+up, down)
  int32_t* bus = nullptr;         // hybrid layers' side read (moe_hybrid.h step 3b): [1 + 3 · max_active + 2 ·
                                  // n_entries + 2 · E]: the groups' count; their experts, first and end list
                                  // positions; each list position's token and routing entry; the routing kernel's
                                  // per-expert words (bus mask, list offset)
  float* bus_h = nullptr;         // f32 [n_entries, I]: the side read's SwiGLU activations, by list position
  size_t bytes = 0;
};

Layout layout_of(const MoeImmaWeights& w, const Counts& c, void* base) {
  const size_t E = static_cast<size_t>(w.n_expert), H = static_cast<size_t>(w.n_embd);
  const size_t I = static_cast<size_t>(w.n_ff), T = static_cast<size_t>(c.n_tok);
  const size_t all = static_cast<size_t>(c.n_all);
  ScratchCarve sc(base);
  Layout l;
  l.logits = sc.take<float>(T * E * 4);
  l.routing = sc.take(moe_routing_bytes(c.n_tok, static_cast<int>(E), w.n_expert_used));
  l.xprep = sc.take(imma_x_bytes(w.n_embd, c.n_tok));
  l.seg_gu = sc.take<ImmaSegment>(static_cast<size_t>(c.n_seg_gu()) * sizeof(ImmaSegment));
  l.seg_dn = sc.take<ImmaSegment>(static_cast<size_t>(c.n_seg_dn()) * sizeof(ImmaSegment));
  l.gu = sc.take<float>(2 * all * I * 4);
  l.aprep = sc.take(all * imma_x_bytes(w.n_ff, 1));
  l.ye = sc.take<float>(all * H * 4);
  l.n_used = sc.take<int32_t>(2 * sizeof(int32_t));
  l.bus = sc.take<int32_t>((1 + 3 * static_cast<size_t>(c.max_active) + 2 * all + 2 * E) * sizeof(int32_t));
  l.bus_h = sc.take<float>(static_cast<size_t>(c.n_entries) * I * 4);
  l.bytes = sc.bytes();
  return l;
}

// ---- kernels -----------------------------------------------------------------------------------------------------

struct TableArgs {
  MoeRouting r;
  const uint8_t* gate;  // tiled stacks
  const uint8_t* up;
  const uint8_t* down;
  uint64_t gu_bytes;  // one expert's gate (= up) matrix
  uint64_t dn_bytes;  // one expert's down matrix
  const void* sh_gate;
  const void* sh_up;
  const void* sh_down;
  int n_tok;
  int n_entries;
  int n_all;
  int chunk;  // vectors per segment at most
  int sh_chunks;
  int n_seg_gu;
  int n_seg_dn;
  ImmaSegment* seg_gu;
  ImmaSegment* seg_dn;
  unsigned* arrivals;  // route_spread_table_kernel's block count (the workspace's chain counter)
  int32_t* n_used;     // [2]: segments the tables hold, gate+up and down (counted tables; else null: empties written)
  const int32_t* resident;  // hybrid layers (route_table_hybrid_kernel): expert id → index in the compact stacks,
                            // < 0: a host expert (no chunks); null: the stacks hold every expert
  float bus_share;          // hybrid layers' side read (moe_hybrid.h step 3b): the share of each token's host
                            // choices read over the bus; 0: none (the bus tables are not written)
  int32_t* bus_n;           // [1]: the side read's groups (one per expert with bus entries)
  int32_t* bus_expert;      // [max_active]: each group's expert, ascending
  int32_t* bus_first;       // [max_active]: its first position in the bus list (entries by expert, then token)
  int32_t* bus_end;         // [max_active]: one past its last
  int32_t* bus_token;       // [n_entries]: each list position's token
  int32_t* bus_entry;       // [n_entries]: each list position's routing entry (the combine's row of ye)
  unsigned* bus_mask;       // [n_expert]: the routing kernel's own words (moe_imma_forward_hybrid's workspace)
  int32_t* bus_off;         // [n_expert]
};

// A segment in 16-byte pieces (the tables are 16-byte aligned: scratch_carve).
constexpr int kSegPieces = static_cast<int>(sizeof(ImmaSegment) / 16);

// One chunk's segment: the matrix, n vectors vec[j] → rows out0 + out[j], stored as kSegPieces 16-byte
// stores (8-byte ones, each lane 80 bytes from the next, cost a warp twice the store wavefronts).
__device__ __forceinline__ void put_segment(ImmaSegment* s, const void* data, int n, const int32_t* vec, int out0,
                                            const int32_t* out) {
  alignas(16) ImmaSegment seg;
  seg.data = data;
  seg.n_vec = n;
#pragma unroll
  for (int j = 0; j < kImmaSegmentVectors; ++j) {
    seg.vec[j] = j < n ? vec[j] : 0;
    seg.out[j] = j < n ? out0 + out[j] : 0;
  }
  const uint4* src = reinterpret_cast<const uint4*>(&seg);
  uint4* dst = reinterpret_cast<uint4*>(s);
#pragma unroll
  for (int i = 0; i < kSegPieces; ++i) dst[i] = src[i];
}

__device__ __forceinline__ void put_empty(ImmaSegment* s) {
  s->data = nullptr;
  s->n_vec = 0;  // skipped: the GEMV reads no other field of an empty segment
}

// The tables' end once `used` chunks are written, by the threads first, first + stride, ...: the counts of both
// tables (counted tables: the GEMVs read these many segments, the rest stays unwritten) or empty segments to the
// tables' capacity.
__device__ __forceinline__ void finish_tables(const TableArgs& a, int used, int first, int stride) {
  if (a.n_used != nullptr) {
    if (first == 0) {
      a.n_used[0] = 2 * used;
      a.n_used[1] = used;
    }
    return;
  }
  for (int i = 2 * used + first; i < a.n_seg_gu; i += stride) put_empty(a.seg_gu + i);
  for (int i = used + first; i < a.n_seg_dn; i += stride) put_empty(a.seg_dn + i);
}

// A table's chunks at most: the shared expert's (one token each at C = 1) and one per routed entry.
constexpr int kMaxTableChunks = kMoeMaxTokens * (kMoeMaxUsed + 1);
// write_tables' description of each chunk, in shared memory.
struct ChunkSmem {
  alignas(8) unsigned char tok[kMaxTableChunks][kImmaSegmentVectors];  // vector j's token
  short expert[kMaxTableChunks];                                       // −1: the shared expert
  short row0[kMaxTableChunks];  // the chunk's first row (entry, or n_entries + token)
  unsigned char n[kMaxTableChunks];
};

// Piece p (16 bytes: words 4p .. 4p + 3) of segment `part` (0 gate, 1 up, 2 down) of chunk c, as put_segment lays a
// segment out — data (2 words), n_vec, vec[8], out[8], the pad; vec / out past n are 0 — by selects, so that the
// lanes of a warp, on different pieces, do not diverge.
static_assert(offsetof(ImmaSegment, data) == 0 && offsetof(ImmaSegment, n_vec) == 8 &&
                  offsetof(ImmaSegment, vec) == 12 && offsetof(ImmaSegment, out) == 12 + 4 * kImmaSegmentVectors &&
                  sizeof(ImmaSegment) == 4 * (4 + 2 * kImmaSegmentVectors) && kImmaSegmentVectors == 8,
              "table_piece's word layout");
__device__ __forceinline__ uint4 table_piece(const TableArgs& a, const ChunkSmem& cs, int c, int part, int p) {
  constexpr int kVec0 = 3, kOut0 = kVec0 + kImmaSegmentVectors, kPad = kOut0 + kImmaSegmentVectors;
  const int n = cs.n[c];
  const int row0 = cs.row0[c];
  const int x = cs.expert[c];
  const uint2 tok = *reinterpret_cast<const uint2*>(cs.tok[c]);
  const uint8_t* stack = part == 0 ? a.gate : part == 1 ? a.up : a.down;
  const void* sh = part == 0 ? a.sh_gate : part == 1 ? a.sh_up : a.sh_down;
  const uint64_t ptr =
      x < 0 ? reinterpret_cast<uint64_t>(sh)
            : reinterpret_cast<uint64_t>(stack) + static_cast<uint64_t>(x) * (part == 2 ? a.dn_bytes : a.gu_bytes);
  const int out0 = (part == 1 ? a.n_all : 0) + row0;
  uint32_t v[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int w = 4 * p + q;
    const int jv = w - kVec0, jo = w - kOut0;
    const int b = jv & 7;
    const uint32_t tok_j = ((b < 4 ? tok.x : tok.y) >> (8 * (b & 3))) & 0xFFu;
    const uint32_t vec = part == 2 ? static_cast<uint32_t>(row0 + jv) : tok_j;
    uint32_t word = 0;
    word = w == 0 ? static_cast<uint32_t>(ptr) : word;
    word = w == 1 ? static_cast<uint32_t>(ptr >> 32) : word;
    word = w == 2 ? static_cast<uint32_t>(n) : word;
    word = (w >= kVec0 && jv < n && w < kOut0) ? vec : word;
    word = (w >= kOut0 && w < kPad && jo < n) ? static_cast<uint32_t>(out0 + jo) : word;
    v[q] = word;
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// The segment tables from the routing as route_block leaves it in shared memory (rt, read after a barrier), by one
// block of kBlock >= kMoeMaxExperts threads, with no global reads, in three passes with a barrier after each of the
// first two:
//   1. thread e counts expert e's chunks (⌈count/C⌉); an exclusive scan places them and marks each chunk with its
//      expert (chunk_expert_s);
//   2. a thread per chunk of the tables (the shared expert's first) describes it in shared memory (ChunkSmem): its
//      expert (−1: the shared one), vectors n, first row and tokens — chunk q of expert x holds x's entries first +
//      qC .. (+ C), whose tokens are the set bits of x's token mask from rank qC on (entries are by expert, then
//      token); the shared expert's chunk c takes tokens Cc .. Cc + C − 1, rows n_entries + token;
//   3. a thread per 16-byte piece of the tables stores it (table_piece), consecutive threads on consecutive pieces,
//      so a warp's store instruction covers 512 contiguous bytes.
// The store path, not the arithmetic, is what a single block pays here: a thread storing its own chunk's segments
// touches 32 lines with each store instruction (that writer took 6.3 µs at 32 tokens, this one 3.7).
template <int kBlock>
__device__ __forceinline__ void write_tables(const TableArgs& a, const moe_route_dev::BlockRoute& rt, int n_expert) {
  static_assert(kBlock >= kMoeMaxExperts, "a thread per expert");
  using Scan = cub::BlockScan<int, kBlock>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int chunk0_s[kMoeMaxExperts];                       // the expert's first routed chunk
  __shared__ short chunk_expert_s[kMoeMaxTokens * kMoeMaxUsed];  // the expert of each routed chunk
  __shared__ ChunkSmem cs;
  const int tid = static_cast<int>(threadIdx.x);

  // 1. Routed experts: expert e's chunks start at the exclusive scan of ⌈count/C⌉ over the experts before it.
  const int e = tid;
  const bool here = e < n_expert && (a.resident == nullptr || a.resident[e] >= 0);
  const int chunks = here ? (__popc(rt.mask[e]) + a.chunk - 1) / a.chunk : 0;
  int chunk0 = 0;
  int total = 0;
  Scan(scan_tmp).ExclusiveSum(chunks, chunk0, total);
  if (e < n_expert) chunk0_s[e] = chunk0;
  for (int q = 0; q < chunks; ++q) chunk_expert_s[chunk0 + q] = static_cast<short>(e);
  __syncthreads();

  // 2. Each chunk's expert, vectors, first row and tokens.
  const int used = a.sh_chunks + total;
  for (int c = tid; c < used; c += kBlock) {
    int x = -1, n = 0, row0 = 0;
    unsigned char tok[kImmaSegmentVectors];
    if (c < a.sh_chunks) {
      const int t0 = c * a.chunk;
      n = min(a.chunk, a.n_tok - t0);
      row0 = a.n_entries + t0;
#pragma unroll
      for (int j = 0; j < kImmaSegmentVectors; ++j) tok[j] = static_cast<unsigned char>(j < n ? t0 + j : 0);
    } else {
      x = chunk_expert_s[c - a.sh_chunks];
      const int q = c - a.sh_chunks - chunk0_s[x];
      unsigned rest = rt.mask[x];
      n = min(a.chunk, __popc(rest) - q * a.chunk);
      for (int i = 0; i < q * a.chunk; ++i) rest &= rest - 1u;  // drop the earlier chunks' tokens
      row0 = rt.first[x] + q * a.chunk;
#pragma unroll
      for (int j = 0; j < kImmaSegmentVectors; ++j) {
        tok[j] = static_cast<unsigned char>(j < n ? __ffs(static_cast<int>(rest)) - 1 : 0);
        if (j < n) rest &= rest - 1u;
      }
    }
    // The stack index table_piece addresses: the expert's own id, or its compact index in a hybrid layer.
    cs.expert[c] = static_cast<short>(x >= 0 && a.resident != nullptr ? a.resident[x] : x);
    cs.n[c] = static_cast<unsigned char>(n);
    cs.row0[c] = static_cast<short>(row0);
#pragma unroll
    for (int j = 0; j < kImmaSegmentVectors; ++j) cs.tok[c][j] = tok[j];
  }
  __syncthreads();

  // 3. The tables in 16-byte pieces: gate+up (segments 2c, 2c + 1), then down (segment c).
  const int gu_pieces = 2 * used * kSegPieces;
  const int all_pieces = gu_pieces + used * kSegPieces;
  auto* const gu = reinterpret_cast<uint4*>(a.seg_gu);
  auto* const dn = reinterpret_cast<uint4*>(a.seg_dn);
  for (int i = tid; i < all_pieces; i += kBlock) {
    const bool down = i >= gu_pieces;
    const int ip = down ? i - gu_pieces : i;
    const int s = ip / kSegPieces;
    const int p = ip - s * kSegPieces;
    (down ? dn : gu)[ip] = table_piece(a, cs, down ? s : s >> 1, down ? 2 : (s & 1), p);
  }
  finish_tables(a, used, tid, kBlock);
}

// Routing (moe_route_dev::route_block, the same code as moe_route) and then the segment tables from it, in one block:
// one launch where moe_route and a table kernel were two.
template <int kPer>
__global__ void __launch_bounds__(moe_route_dev::kThreads)
    route_table_kernel(const float* __restrict__ logits, int n_expert, int k, TableArgs a) {
  pdl_trigger();
  pdl_wait();
  const moe_route_dev::BlockRoute rt = moe_route_dev::route_block<kPer>(logits, a.n_tok, n_expert, k, a.r);
  __syncthreads();  // the routing's shared-memory results are visible to the whole block
  write_tables<moe_route_dev::kThreads>(a, rt, n_expert);
}

// route_table_kernel for a hybrid layer (moe_hybrid.h step 1; a.resident set). After the routing, entry (t, j) of
// a host expert (not resident) goes to the host or, with the side read (a.bus_share > 0), to the bus: of token t's
// h_t host choices in selection order the last round(h_t · share) are the bus's — a rule of the token alone, so a
// token's results do not depend on the batch it runs in. The bus entries form a list sorted by expert, then token
// (two block scans over the experts: list offsets and group slots), each position with its token and routing entry,
// and one group (expert, first, end position) per expert with bus entries. A host entry is written to host_choices
// (the device's and the bus's as kExpertNotHere) and its routing entry's weight set to −1 (its place: the expert's
// first entry + the tokens below t in its mask, as group_entries placed it); a bus entry keeps its weight, so the
// combine reads its row of ye like a resident expert's. Then the tables, whose chunks skip the host experts (bus or
// not) and address the compact stacks.
template <int kPer>
__global__ void __launch_bounds__(moe_route_dev::kThreads)
    route_table_hybrid_kernel(const float* __restrict__ logits, int n_expert, int k, TableArgs a,
                              ExpertChoice* __restrict__ host_choices) {
  // The tables' writer and the routing fill the static shared memory: the side read's per-expert words live in the
  // workspace (a.bus_mask, a.bus_off; ordered within the block by its barriers) and its scans take the warp-scan
  // form, whose temporary storage is a word per warp.
  using Scan = cub::BlockScan<int, moe_route_dev::kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename Scan::TempStorage bus_scan;
  pdl_trigger();
  pdl_wait();
  const moe_route_dev::BlockRoute rt = moe_route_dev::route_block<kPer>(logits, a.n_tok, n_expert, k, a.r);
  const int tid = static_cast<int>(threadIdx.x);
  const bool side_read = a.bus_share > 0.0f;
  unsigned* const bus_mask = a.bus_mask;  // [n_expert] bit t: token t's choice of the expert is the bus's
  int32_t* const bus_off = a.bus_off;     // [n_expert] the expert's first list position
  if (side_read && tid < n_expert) bus_mask[tid] = 0u;
  __syncthreads();  // the routing's results (shared and global) are visible to the whole block
  const bool entry = tid < a.n_entries;
  const int t = tid / k;
  const int x = entry ? a.r.ids[tid] : 0;  // written by this block before the barrier
  const bool host = entry && a.resident[x] < 0;
  bool bus = false;
  if (side_read) {
    if (host) {
      int rank = 0, h_t = 0;  // this choice's rank among the token's host choices, and their count
      for (int j = 0; j < k; ++j) {
        const bool hj = a.resident[a.r.ids[t * k + j]] < 0;
        h_t += hj ? 1 : 0;
        rank += (hj && t * k + j < tid) ? 1 : 0;
      }
      const int m = min(h_t, static_cast<int>(floorf(__fmaf_rn(static_cast<float>(h_t), a.bus_share, 0.5f))));
      bus = rank >= h_t - m;
      if (bus) atomicOr(&bus_mask[x], 1u << t);
    }
    __syncthreads();  // bus_mask
    const int e = tid;
    const int count = e < n_expert ? __popc(__ldcg(&bus_mask[e])) : 0;
    int off = 0, slot = 0, n_groups = 0, total = 0;
    Scan(bus_scan).ExclusiveSum(count, off, total);
    __syncthreads();  // bus_scan is reused
    Scan(bus_scan).ExclusiveSum(count > 0 ? 1 : 0, slot, n_groups);
    if (e < n_expert) bus_off[e] = off;
    if (count > 0) {
      a.bus_expert[slot] = e;
      a.bus_first[slot] = off;
      a.bus_end[slot] = off + count;
    }
    if (tid == 0) *a.bus_n = n_groups;
    __syncthreads();  // bus_off
  }
  if (entry) {
    const int routing_entry = host ? rt.first[x] + __popc(rt.mask[x] & ((1u << t) - 1u)) : 0;
    if (bus) {
      const int p = __ldcg(&bus_off[x]) + __popc(__ldcg(&bus_mask[x]) & ((1u << t) - 1u));
      a.bus_token[p] = t;
      a.bus_entry[p] = routing_entry;
    }
    const bool to_host = host && !bus;
    ExpertChoice c;
    c.expert = to_host ? x : kExpertNotHere;
    c.weight = to_host ? a.r.weights[tid] : 0.0f;
    host_choices[tid] = c;
    if (to_host) a.r.entry_weight[routing_entry] = -1.0f;
  }
  write_tables<moe_route_dev::kThreads>(a, rt, n_expert);
}

// The same for one token by one warp: its k experts are distinct, so the grouping is its selections sorted by id —
// selection j's entry, active rank and chunk are the number of its ids below j's — and each expert is one chunk of
// one vector. The routing arrays and the tables are route_table_kernel's, byte for byte, without its block scans and
// barriers over 1024 threads (test_moe_imma compares the two). Its routing is moe_route_dev's one-token helpers (
// route_single, put_single_entry). It stays a launch of its own: folded into the router kernel's last block it
// measured slower.
template <int kPer>
__global__ void __launch_bounds__(32)
    route_table_one_kernel(const float* __restrict__ logits, int n_expert, int k, TableArgs a) {
  pdl_trigger();
  pdl_wait();
  const int lane = static_cast<int>(threadIdx.x);
  int my_id = 0;
  float my_p = 0.0f;
  float denom = 0.0f;
  int pos = 0;
  moe_route_dev::route_single<kPer>(logits, n_expert, k, lane, my_id, my_p, denom, pos);
  const MoeRouting& r = a.r;
  const int32_t tok[kImmaSegmentVectors] = {};
  if (lane < k) {
    moe_route_dev::put_single_entry(r, lane, my_id, __fdiv_rn(my_p, denom), pos);
    int32_t row[kImmaSegmentVectors] = {};
    row[0] = pos;
    const int at = a.sh_chunks + pos;
    put_segment(a.seg_gu + 2 * at, a.gate + static_cast<uint64_t>(my_id) * a.gu_bytes, 1, tok, 0, row);
    put_segment(a.seg_gu + 2 * at + 1, a.up + static_cast<uint64_t>(my_id) * a.gu_bytes, 1, tok, a.n_all, row);
    put_segment(a.seg_dn + at, a.down + static_cast<uint64_t>(my_id) * a.dn_bytes, 1, row, 0, row);
  }
  if (lane == 0) {
    *r.n_active = k;
    r.active_offset[k] = k;
    if (a.sh_chunks > 0) {  // the shared expert's one chunk: token 0, row n_entries
      int32_t row[kImmaSegmentVectors] = {};
      row[0] = a.n_entries;
      put_segment(a.seg_gu, a.sh_gate, 1, tok, 0, row);
      put_segment(a.seg_gu + 1, a.sh_up, 1, tok, a.n_all, row);
      put_segment(a.seg_dn, a.sh_down, 1, row, 0, row);
    }
  }
  finish_tables(a, a.sh_chunks + k, lane, 32);
}

// The same for calls of at most 32 entries (n_tok · k; 2-4 tokens of a top-8 layer) by n_tok warps: warp t routes
// token t, then warp 0 groups with one entry a lane, no block scans — lane i = entry (t, j) with expert x finds by
// 32 shuffles its place in the (expert, token) order (pos), its expert's count and first entry, and whether it is the
// expert's first entry (rep); the reps' counts give each expert's active rank and first chunk. The routing arrays
// and the tables are route_table_kernel's, byte for byte (test_moe_imma compares the two). 0.7-1.3 µs faster than the
// one-block kernel at 2-4 tokens; one token keeps route_table_one_kernel, faster still.
template <int kPer>
__global__ void __launch_bounds__(32 * kMoeMaxUsed)
    route_table_warp_kernel(const float* __restrict__ logits, int n_expert, int k, TableArgs a) {
  __shared__ int ids_s[32];
  __shared__ float w_s[32];
  __shared__ int tok_s[32];  // the entries' tokens in (expert, token) order
  pdl_trigger();
  pdl_wait();
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const MoeRouting& r = a.r;
  {
    int my_id = 0;
    float my_p = 0.0f;
    float sel_sum = 0.0f;
    moe_route_dev::route_token<kPer>(logits + static_cast<size_t>(warp) * n_expert, n_expert, k, lane, my_id, my_p,
                                     sel_sum);
    const float denom = fmaxf(sel_sum, moe_route_dev::kWeightSumMin);
    if (lane < k) {
      const float wt = __fdiv_rn(my_p, denom);
      r.ids[warp * k + lane] = my_id;
      r.weights[warp * k + lane] = wt;
      ids_s[warp * k + lane] = my_id;
      w_s[warp * k + lane] = wt;
    }
  }
  __syncthreads();
  if (warp != 0) return;
  constexpr unsigned kAll = moe_route_dev::kFullMask;
  const int n_entries = a.n_entries;
  const bool live = lane < n_entries;
  const int x = live ? ids_s[lane] : INT_MAX;  // past the entries: after every expert
  const int t = lane / k;
  int pos = 0, first = 0, count = 0, below = 0;
  for (int i = 0; i < 32; ++i) {
    const int xi = __shfl_sync(kAll, x, i);
    pos += (xi < x || (xi == x && i < lane)) ? 1 : 0;  // entry order: expert, then token (= entry index)
    first += xi < x ? 1 : 0;
    count += xi == x ? 1 : 0;
    below += (i / k == t && xi < x) ? 1 : 0;  // the token's selections with a lower id
  }
  const bool rep = live && pos == first;
  const int C = a.chunk;
  const int my_chunks = rep ? (count + C - 1) / C : 0;
  int rank = 0, chunk0 = 0, n_active = 0, total = 0;
  for (int i = 0; i < 32; ++i) {
    const int xi = __shfl_sync(kAll, x, i);
    const int ci = __shfl_sync(kAll, my_chunks, i);
    const bool ri = __shfl_sync(kAll, rep, i);
    rank += (ri && xi < x) ? 1 : 0;
    chunk0 += xi < x ? ci : 0;
    n_active += ri ? 1 : 0;
    total += ci;
  }
  if (live) {
    r.entry_token[pos] = t;
    r.entry_weight[pos] = w_s[lane];
    r.token_entry[t * k + below] = pos;
    tok_s[pos] = t;
    if (rep) {
      r.active_expert[rank] = x;
      r.active_offset[rank] = first;
    }
  }
  if (lane == 0) {
    *r.n_active = n_active;
    r.active_offset[n_active] = n_entries;
  }
  __syncwarp();
  // Chunk q of expert x (the lane at its first entry writes it): entries first + qC .. + n − 1, rows = those entries.
  const int q = (pos - first) / C;
  if (live && pos - first == q * C) {
    const int n = min(C, count - q * C);
    int32_t tok[kImmaSegmentVectors];
    int32_t row[kImmaSegmentVectors];
#pragma unroll
    for (int j = 0; j < kImmaSegmentVectors; ++j) {
      tok[j] = j < n ? tok_s[pos + j] : 0;
      row[j] = pos + j;
    }
    const int at = a.sh_chunks + chunk0 + q;
    put_segment(a.seg_gu + 2 * at, a.gate + static_cast<uint64_t>(x) * a.gu_bytes, n, tok, 0, row);
    put_segment(a.seg_gu + 2 * at + 1, a.up + static_cast<uint64_t>(x) * a.gu_bytes, n, tok, a.n_all, row);
    put_segment(a.seg_dn + at, a.down + static_cast<uint64_t>(x) * a.dn_bytes, n, row, 0, row);
  }
  // The shared expert's chunks and the tables' end: finish_tables' stores, written out for the warp (through the
  // helper the kernel measured slower).
  for (int c = lane; c < a.sh_chunks; c += 32) {
    const int t0 = c * C;
    const int n = min(C, a.n_tok - t0);
    int32_t tok[kImmaSegmentVectors];
    int32_t row[kImmaSegmentVectors];
#pragma unroll
    for (int j = 0; j < kImmaSegmentVectors; ++j) {
      tok[j] = t0 + j;
      row[j] = n_entries + t0 + j;
    }
    put_segment(a.seg_gu + 2 * c, a.sh_gate, n, tok, 0, row);
    put_segment(a.seg_gu + 2 * c + 1, a.sh_up, n, tok, a.n_all, row);
    put_segment(a.seg_dn + c, a.sh_down, n, row, 0, row);
  }
  const int used = a.sh_chunks + total;
  if (a.n_used != nullptr) {
    if (lane == 0) {
      a.n_used[0] = 2 * used;
      a.n_used[1] = used;
    }
    return;
  }
  for (int i = 2 * used + lane; i < a.n_seg_gu; i += 32) put_empty(a.seg_gu + i);
  for (int i = used + lane; i < a.n_seg_dn; i += 32) put_empty(a.seg_dn + i);
}

// The same from MoeImmaTuning::route_spread_min_tokens tokens, over n_tok blocks: a block per token routes it, the last
// block to finish groups the entries and writes the tables (moe_route_dev::route_spread; a.arrivals zero before the
// launch and after it).
template <int kPer>
__global__ void __launch_bounds__(moe_route_dev::kThreads)
    route_spread_table_kernel(const float* __restrict__ logits, int n_expert, int k, TableArgs a) {
  pdl_trigger();
  pdl_wait();
  moe_route_dev::BlockRoute rt{};
  if (!moe_route_dev::route_spread<kPer>(logits, a.n_tok, n_expert, k, a.r, a.arrivals, &rt)) return;
  __syncthreads();
  write_tables<moe_route_dev::kThreads>(a, rt, n_expert);
}

// The f32 router's logits (blocks [0, router_blocks): router_blocks_of, kRouterWarps experts × a token group each) and
// x's prepared form for the grouped gate+up GEMV (the blocks after: per token ⌈groups/kRouterWarps⌉ blocks, a warp per
// 256-element group) in one launch — the two only read x. kStaged: dynamic shared memory of router_stage_bytes(n_tok).
template <bool kStaged>
__global__ void __launch_bounds__(kRouterWarps * 32)
    router_prepare_kernel(const float* __restrict__ w, const float* __restrict__ x, int h, int n_expert, int n_tok,
                          float* __restrict__ logits, int router_blocks, imma_prep::XLayout lay,
                          uint8_t* __restrict__ xprep) {
  extern __shared__ float4 router_xs[];
  pdl_trigger();  // launched plainly (the layer's first kernel): lets the route-and-tables kernel launch early
  const int b = static_cast<int>(blockIdx.x);
  if (b < router_blocks) {
    router_logits_block<kStaged>(w, x, h, n_expert, n_tok, logits, b, static_cast<int>(threadIdx.x) / 32, router_xs);
    return;
  }
  const int per_tok = (lay.n_groups + kRouterWarps - 1) / kRouterWarps;
  const int vec = (b - router_blocks) / per_tok;
  const int grp = (b - router_blocks) % per_tok * kRouterWarps + static_cast<int>(threadIdx.x) / 32;
  imma_prep::prepare_group(imma_prep::PlainRows{x}, h, lay, xprep, vec, grp, static_cast<int>(threadIdx.x) % 32);
}

// The same for many tokens with router_logits_tile's tiles (router_tile_blocks_of router blocks; kTileStageBytes of
// dynamic shared memory), two blocks an SM.
__global__ void __launch_bounds__(kRouterWarps * 32, 2)
    router_tile_prepare_kernel(const float* __restrict__ w, const float* __restrict__ x, int h, int n_expert, int n_tok,
                               float* __restrict__ logits, int router_blocks, imma_prep::XLayout lay,
                               uint8_t* __restrict__ xprep) {
  extern __shared__ float4 router_xs[];
  pdl_trigger();  // as router_prepare_kernel
  const int b = static_cast<int>(blockIdx.x);
  if (b < router_blocks) {
    router_logits_tile(w, x, h, n_expert, n_tok, logits, b, router_xs);
    return;
  }
  const int per_tok = (lay.n_groups + kRouterWarps - 1) / kRouterWarps;
  const int vec = (b - router_blocks) / per_tok;
  const int grp = (b - router_blocks) % per_tok * kRouterWarps + static_cast<int>(threadIdx.x) / 32;
  imma_prep::prepare_group(imma_prep::PlainRows{x}, h, lay, xprep, vec, grp, static_cast<int>(threadIdx.x) % 32);
}

// The combine kernel's part before its wait: token t's entries and weights into ent_s / wt_s and, with kShared, its
// shared-expert gate sigmoid(gate_inp · x[t]) (returned; 0 without), then a barrier so the block sees the entries.
template <GgmlType T, bool kShared>
__device__ __forceinline__ float combine_prologue(const int32_t* token_entry, const float* entry_weight, int k,
                                                  const uint8_t* gate_inp, const float* x, int h, int t, int32_t* ent_s,
                                                  float* wt_s) {
  if (static_cast<int>(threadIdx.x) < k) {
    const int e = ld_dep(token_entry + t * k + static_cast<int>(threadIdx.x));
    ent_s[threadIdx.x] = e;
    wt_s[threadIdx.x] = ld_dep(entry_weight + e);
  }
  float s = 0.0f;
  if constexpr (kShared) s = moe_combine::shared_gate<T>(gate_inp, x + static_cast<int64_t>(t) * h, h);
  __syncthreads();
  return s;
}

// out[t] = Σ_j ye[token_entry[t][j]] · entry_weight[...] from 0 in ascending expert order, then with kShared
// + sigmoid(gate_inp · x[t]) · ye[n_entries + t]; the shared gate logit (a dot product of H elements of type T) is
// computed by each block: 256 lane-strided partial sums, a butterfly per warp, then the 8 warp sums in order. It reads
// only the layer's input x (written before the layer's first, plainly launched kernel began) and a weight, so it runs
// before the wait for the down GEMV: under a programmatic launch it overlaps that GEMV. So do the loads of the token's
// entries and weights: the routing kernel wrote them, and it completed before this kernel could launch (the SwiGLU
// preparation lets the down GEMV launch only after its own wait, so after the gate+up GEMV completed; see
// moe_imma_forward).
template <GgmlType T, bool kShared>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const float* __restrict__ ye, const int32_t* __restrict__ token_entry,
                   const float* __restrict__ entry_weight, int k, int n_entries, const uint8_t* __restrict__ gate_inp,
                   const float* __restrict__ x, int h, float* __restrict__ out) {
  const int t = static_cast<int>(blockIdx.y);
  const int c = static_cast<int>(blockIdx.x) * kCombineThreads + static_cast<int>(threadIdx.x);
  pdl_trigger();
  __shared__ int32_t ent_s[kMoeMaxUsed];
  __shared__ float wt_s[kMoeMaxUsed];
  const float s = combine_prologue<T, kShared>(token_entry, entry_weight, k, gate_inp, x, h, t, ent_s, wt_s);
  pdl_wait();
  if (c >= h) return;
  // The routed sum over the entries loaded above.
  float y = moe_combine::routed_sum_of(
      ye, k, c, h, [&](int j) { return ent_s[j]; }, [&](int j, int) { return wt_s[j]; });
  if constexpr (kShared) y = __fadd_rn(y, __fmul_rn(s, ld_dep(ye + static_cast<int64_t>(n_entries + t) * h + c)));
  out[static_cast<int64_t>(t) * h + c] = y;
}

// ---- checks ------------------------------------------------------------------------------------------------------

Status bad(const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "moe_imma: " + m); }
Status unsupported(const std::string& m) { return make_error(ErrorCode::kUnsupported, "moe_imma: " + m); }

std::string shape(int64_t a, int64_t b) {
  std::string s(1, '{');
  s += std::to_string(a);
  s += ", ";
  s += std::to_string(b);
  s += '}';
  return s;
}

// The types and shapes the tiled matrices of a layer must take: gate / up {H, I}, down {I, H}.
Status check_tiled_shapes(GgmlType gate_up, GgmlType down, int64_t H, int64_t I) {
  for (const auto& [role, t, cols, rows] : {std::tuple{"gate/up", gate_up, H, I}, std::tuple{"down", down, I, H}}) {
    if (!gemv_imma_supports(t, cols, rows)) {
      return unsupported(std::string(role) + " experts of " + tname(t) + " " + shape(cols, rows) +
                         " (gemv_imma_supports: Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0, Q4_0 and Q8_0 n_cols % 64, the "
                         "k-quants n_cols % 256, n_rows % 16, n_cols <= " +
                         std::to_string(kImmaMaxCols) + ")");
    }
  }
  return ok_status();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Status moe_imma_check_raw(const MoeDeviceWeights& raw) {
  KESTREL_TRY(moe_check_weights(raw));
  const GgmlType t = raw.gate_exps.type, td = raw.down_exps.type;
  const int64_t H = raw.router.n_cols, I = raw.gate_exps.n_rows;
  KESTREL_TRY(check_tiled_shapes(t, td, H, I));
  if (raw.has_shared_expert()) {
    if (raw.gate_shexp.type != t || raw.up_shexp.type != t || raw.down_shexp.type != td) {
      return unsupported("the shared expert's types must be the routed experts' (gate/up " + tname(t) + ", down " +
                         tname(td) + "); got gate " + tname(raw.gate_shexp.type) + ", up " + tname(raw.up_shexp.type) +
                         ", down " + tname(raw.down_shexp.type));
    }
    if (raw.gate_shexp.n_rows != I) {
      return unsupported("shared expert ff " + std::to_string(raw.gate_shexp.n_rows) + " differs from the experts' " +
                         std::to_string(I));
    }
  }
  return ok_status();
}

namespace {

// moe_imma_check_weights; with routed_may_be_null (a hybrid layer with no resident expert) the routed stacks may be
// null.
Status check_weights(const MoeImmaWeights& w, bool routed_may_be_null) {
  if (w.router.data == nullptr || w.router.n_cols != w.n_embd || w.router.n_rows != w.n_expert) {
    return bad("ffn_gate_inp has shape " + shape(w.router.n_cols, w.router.n_rows) +
               (w.router.data == nullptr ? " and no data" : "") + ", expected " + shape(w.n_embd, w.n_expert));
  }
  if (!gemv_supports(w.router.type)) return unsupported("router type " + tname(w.router.type));
  if (w.n_expert < 1 || w.n_expert > kMoeMaxExperts || w.n_expert_used < 1 || w.n_expert_used > w.n_expert ||
      w.n_expert_used > kMoeMaxUsed) {
    return bad(std::to_string(w.n_expert) + " experts, " + std::to_string(w.n_expert_used) +
               " used: need 1 <= used <= min(E, 32), E <= 1024");
  }
  KESTREL_TRY(check_tiled_shapes(w.gate_up_type, w.down_type, w.n_embd, w.n_ff));
  const bool none = w.gate_exps == nullptr && w.up_exps == nullptr && w.down_exps == nullptr;
  if (!(routed_may_be_null && none) && (w.gate_exps == nullptr || w.up_exps == nullptr || w.down_exps == nullptr ||
                                        !aligned16(w.gate_exps) || !aligned16(w.up_exps) || !aligned16(w.down_exps))) {
    return bad("a routed expert stack (gate, up, down) is null or not 16-byte aligned");
  }
  if (w.has_shared_expert()) {
    if (w.up_shexp == nullptr || w.down_shexp == nullptr || !aligned16(w.gate_shexp) || !aligned16(w.up_shexp) ||
        !aligned16(w.down_shexp)) {
      return bad("a shared expert matrix (gate, up, down) is null or not 16-byte aligned");
    }
    const DeviceMatrixView& g = w.shared_gate_inp;
    if (g.data == nullptr || g.n_cols != w.n_embd || g.n_rows != 1) {
      return bad("ffn_gate_inp_shexp has shape " + shape(g.n_cols, g.n_rows) +
                 (g.data == nullptr ? " and no data" : "") + ", expected " + shape(w.n_embd, 1));
    }
    if (!has_dequant(g.type) || !ggml_row_bytes(g.type, static_cast<uint64_t>(w.n_embd))) {
      return unsupported("ffn_gate_inp_shexp type " + tname(g.type));
    }
  }
  return ok_status();
}

}  // namespace

Status moe_imma_check_weights(const MoeImmaWeights& w) { return check_weights(w, false); }

Status moe_imma_tile_experts(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, int64_t n_expert,
                             std::span<uint8_t> out) {
  const uint64_t tiled = tiled_bytes(type, n_cols, n_rows);
  if (n_expert < 1 || raw == nullptr || out.size() != tiled * static_cast<uint64_t>(n_expert)) {
    return bad("moe_imma_tile_experts: " + std::to_string(n_expert) + " experts of " + tname(type) + " " +
               shape(n_cols, n_rows) + " need " +
               std::to_string(tiled * static_cast<uint64_t>(std::max<int64_t>(n_expert, 0))) +
               " output bytes and non-null input; got " + std::to_string(out.size()));
  }
  return tile_matrix_stack(type, raw, n_cols, n_rows, n_expert, out);  // raw and tiled bytes are equal
}

Expected<std::unique_ptr<MoeImmaLayer>> MoeImmaLayer::from_raw_device(const MoeDeviceWeights& raw) {
  KESTREL_TRY(moe_imma_check_raw(raw));
  const GgmlType t = raw.gate_exps.type, td = raw.down_exps.type;
  const int64_t H = raw.router.n_cols, I = raw.gate_exps.n_rows, E = raw.router.n_rows;
  const uint64_t gu = tiled_bytes(t, H, I), dn = tiled_bytes(td, I, H);
  const uint64_t E64 = static_cast<uint64_t>(E);
  struct Piece {
    const void* src;
    GgmlType type;
    int64_t n_cols, n_rows, n_mat;
    uint64_t bytes;
  };
  std::vector<Piece> pieces = {{raw.gate_exps.data, t, H, I, E, gu * E64},
                               {raw.up_exps.data, t, H, I, E, gu * E64},
                               {raw.down_exps.data, td, I, H, E, dn * E64}};
  if (raw.has_shared_expert()) {
    pieces.push_back({raw.gate_shexp.data, t, H, I, 1, gu});
    pieces.push_back({raw.up_shexp.data, t, H, I, 1, gu});
    pieces.push_back({raw.down_shexp.data, td, I, H, 1, dn});
  }
  std::unique_ptr<MoeImmaLayer> layer(new MoeImmaLayer());
  uint64_t total = 0;
  for (const Piece& p : pieces) total += align16(p.bytes);
  KESTREL_CUDA_TRY(cudaMalloc(&layer->base_, total));
  layer->bytes_ = total;
  std::vector<const void*> placed;
  std::vector<uint8_t> host_raw;
  std::vector<uint8_t> host_tiled;
  uint64_t at = 0;
  for (const Piece& p : pieces) {
    host_raw.resize(p.bytes);
    host_tiled.resize(p.bytes);
    KESTREL_CUDA_TRY(memcpy_synced(host_raw.data(), p.src, p.bytes, cudaMemcpyDeviceToHost));
    KESTREL_TRY(moe_imma_tile_experts(p.type, host_raw.data(), p.n_cols, p.n_rows, p.n_mat, host_tiled));
    uint8_t* dst = static_cast<uint8_t*>(layer->base_) + at;
    KESTREL_CUDA_TRY(memcpy_synced(dst, host_tiled.data(), p.bytes, cudaMemcpyHostToDevice));
    placed.push_back(dst);
    at += align16(p.bytes);
  }
  MoeImmaWeights& w = layer->w_;
  w.gate_up_type = t;
  w.down_type = td;
  w.n_expert_used = raw.n_expert_used;
  w.n_embd = H;
  w.n_ff = I;
  w.n_expert = E;
  w.router = raw.router;
  w.gate_exps = placed[0];
  w.up_exps = placed[1];
  w.down_exps = placed[2];
  if (raw.has_shared_expert()) {
    w.shared_gate_inp = raw.shared_gate_inp;
    w.gate_shexp = placed[3];
    w.up_shexp = placed[4];
    w.down_shexp = placed[5];
  }
  KESTREL_TRY(moe_imma_check_weights(w));
  return Expected<std::unique_ptr<MoeImmaLayer>>(std::move(layer));
}

MoeImmaLayer::~MoeImmaLayer() {
  if (base_ != nullptr) (void)cudaFree(base_);
}

// The workspace: the routing counter, then the scratch.
size_t moe_imma_counter_bytes(const MoeImmaWeights&) { return kChainCounterBytes; }

size_t moe_imma_workspace_bytes(const MoeImmaWeights& w, int n_tok) {
  if (n_tok < 1 || n_tok > kMoeMaxTokens) return 0;
  return moe_imma_counter_bytes(w) + layout_of(w, counts_of(w, n_tok, 1), nullptr).bytes;
}

Status moe_imma_workspace_init(const MoeImmaWeights& w, void* workspace, cudaStream_t stream) {
  if (workspace == nullptr) return bad("moe_imma_workspace_init: null workspace");
  KESTREL_CUDA_TRY(cudaMemsetAsync(workspace, 0, moe_imma_counter_bytes(w), stream));
  return ok_status();
}

namespace {

// Whether the router's logits and x's preparation share one launch (an f32 router).
bool router_prepares_x(const MoeImmaWeights& w) {
  return w.router.type == GgmlType::kF32 && w.n_embd % 4 == 0 && aligned16(w.router.data);
}

// The router's logits and, with an f32 router, x's prepared form, in one launch (router_prepare_kernel: any n_tok;
// from kTileMinTokens tokens in router_logits_tile's tiles, the same bits);
// other routers: gpu::gemv alone, n_tok <= kMoeMaxTokens (the caller prepares x).
Status router_logits_and_prepare(const MoeImmaWeights& w, const float* x, int n_tok, float* logits, void* xprep,
                                 cudaStream_t stream) {
  const int E = static_cast<int>(w.n_expert);
  const int H = static_cast<int>(w.n_embd);
  if (!router_prepares_x(w)) return gemv(w.router, x, n_tok, logits, stream);
  const bool tile = router_tile_takes(E, H, n_tok);
  const int router_blocks = tile ? router_tile_blocks_of(E, n_tok) : router_blocks_of(E, n_tok);
  const imma_prep::XLayout lay = imma_prep::x_layout(H);
  const int prep_blocks = n_tok * ((lay.n_groups + kRouterWarps - 1) / kRouterWarps);
  const dim3 grid(static_cast<unsigned>(router_blocks + prep_blocks));
  auto* const out = static_cast<uint8_t*>(xprep);
  if (tile) {
    router_tile_prepare_kernel<<<grid, kRouterWarps * 32, kTileStageBytes, stream>>>(
        static_cast<const float*>(w.router.data), x, H, E, n_tok, logits, router_blocks, lay, out);
  } else if (n_tok >= kRouterStageMinTokens) {
    router_prepare_kernel<true><<<grid, kRouterWarps * 32, router_stage_bytes(n_tok), stream>>>(
        static_cast<const float*>(w.router.data), x, H, E, n_tok, logits, router_blocks, lay, out);
  } else {
    router_prepare_kernel<false><<<grid, kRouterWarps * 32, 0, stream>>>(static_cast<const float*>(w.router.data), x, H,
                                                                         E, n_tok, logits, router_blocks, lay, out);
  }
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

// moe_imma_forward, and with `h` moe_imma_forward_hybrid (moe_hybrid.h's steps: the routing by
// route_table_hybrid_kernel, the hooks, the GEMVs over the resident experts' and the shared expert's segments, the
// hybrid combine).
Status forward(const MoeImmaWeights& w, const float* x, int n_tok, float* out, void* workspace, cudaStream_t stream,
               const MoeImmaTuning& tuning, MoeLaunchInfo* info, const MoeHybrid* h, const MoePhaseHooks* hooks) {
  KESTREL_TRY(check_weights(w, h != nullptr && h->n_resident == 0));
  if (h != nullptr) KESTREL_TRY(moe_hybrid_check(*h, w.n_expert));
  if (n_tok < 1 || n_tok > kMoeMaxTokens) {
    return bad("n_tok " + std::to_string(n_tok) + " outside [1, " + std::to_string(kMoeMaxTokens) + "]");
  }
  if (tuning.segment_vectors < 1 || tuning.segment_vectors > kImmaSegmentVectors) {
    return bad("tuning.segment_vectors " + std::to_string(tuning.segment_vectors) + " outside [1, " +
               std::to_string(kImmaSegmentVectors) + "]");
  }
  if (x == nullptr || out == nullptr || workspace == nullptr || !aligned16(x) || !aligned16(workspace)) {
    return bad("x, out or workspace is null, or x / workspace is not 16-byte aligned");
  }
  auto* const route_arrivals = static_cast<unsigned*>(workspace);
  void* const scratch = static_cast<unsigned char*>(workspace) + kChainCounterBytes;
  const int E = static_cast<int>(w.n_expert);
  const int H = static_cast<int>(w.n_embd);
  const int I = static_cast<int>(w.n_ff);
  const int k = w.n_expert_used;
  const Counts c = counts_of(w, n_tok, tuning.segment_vectors);
  const Layout l = layout_of(w, counts_of(w, n_tok, 1), scratch);
  const MoeRouting r = moe_routing_carve(l.routing, n_tok, E, k);
  // The prepared form of n vectors is n back-to-back vectors (the segments' vec indices rely on it).
  const uint64_t avec = imma_x_bytes(I, 1);
  if (avec == 0 || imma_x_bytes(I, 2) != 2 * avec) {
    return make_error(ErrorCode::kInternal, "moe_imma: imma_x_bytes is not linear in n_vec");
  }
  int launches = 0;
  // Every launch after the first programmatic up to tuning.programmatic_max_tokens tokens; above it only the spread
  // routing's, the down GEMV's and the combine's.
  const bool pdl = n_tok <= tuning.programmatic_max_tokens;

  // The layer's first kernel launches plainly: chained to the kernel before the layer it measured no faster, and
  // slower at 4-16 tokens.
  const bool f32_router = router_prepares_x(w);
  KESTREL_TRY(router_logits_and_prepare(w, x, n_tok, l.logits, l.xprep, stream));
  ++launches;
  if (hooks != nullptr && hooks->after_logits) KESTREL_TRY(hooks->after_logits());

  TableArgs ta{};
  ta.r = r;
  ta.gate = static_cast<const uint8_t*>(w.gate_exps);
  ta.up = static_cast<const uint8_t*>(w.up_exps);
  ta.down = static_cast<const uint8_t*>(w.down_exps);
  ta.gu_bytes = tiled_bytes(w.gate_up_type, H, I);
  ta.dn_bytes = tiled_bytes(w.down_type, I, H);
  ta.sh_gate = w.gate_shexp;
  ta.sh_up = w.up_shexp;
  ta.sh_down = w.down_shexp;
  ta.n_tok = n_tok;
  ta.n_entries = c.n_entries;
  ta.n_all = c.n_all;
  ta.chunk = c.chunk;
  ta.sh_chunks = c.sh_chunks;
  ta.n_seg_gu = c.n_seg_gu();
  ta.n_seg_dn = c.n_seg_dn();
  ta.seg_gu = l.seg_gu;
  ta.seg_dn = l.seg_dn;
  // Counted tables: the writer leaves both tables' counts in l.n_used (gate+up, down), and each GEMV reads its own.
  const bool counted = n_tok >= kCountedTablesMinTokens;
  ta.n_used = counted ? l.n_used : nullptr;
  const int32_t* const used_gu = ta.n_used;
  const int32_t* const used_dn = counted ? l.n_used + 1 : nullptr;
  ta.arrivals = route_arrivals;
  ta.resident = h != nullptr ? h->resident : nullptr;
  const bool side_read = h != nullptr && h->side_read();
  if (side_read) {
    if (!(h->bus_share <= 1.0f)) return bad("bus_share " + std::to_string(h->bus_share) + " outside [0, 1]");
    ta.bus_share = h->bus_share;
    ta.bus_n = l.bus;
    ta.bus_expert = l.bus + 1;
    ta.bus_first = ta.bus_expert + c.max_active;
    ta.bus_end = ta.bus_first + c.max_active;
    ta.bus_token = ta.bus_end + c.max_active;
    ta.bus_entry = ta.bus_token + c.n_entries;
    ta.bus_mask = reinterpret_cast<unsigned*>(ta.bus_entry + c.n_entries);
    ta.bus_off = ta.bus_entry + c.n_entries + E;
  }
  const bool spread = n_tok >= tuning.route_spread_min_tokens;
  const bool by_warp = c.n_entries <= 32 && !spread && tuning.route_by_warp;
  KESTREL_TRY(moe_route_dev::with_route_per_lane(E, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    if (h != nullptr) {  // the one-block routing, with the split (hybrid layers take no other form)
      return launch_programmatic(pdl, route_table_hybrid_kernel<kPer>, dim3(1), dim3(moe_route_dev::kThreads), 0,
                                 stream, l.logits, E, k, ta, h->host_choices);
    }
    if (by_warp && n_tok == 1) {
      return launch_programmatic(pdl, route_table_one_kernel<kPer>, dim3(1), dim3(32), 0, stream, l.logits, E, k, ta);
    }
    if (by_warp) {
      return launch_programmatic(pdl, route_table_warp_kernel<kPer>, dim3(1), dim3(32 * static_cast<unsigned>(n_tok)),
                                 0, stream, l.logits, E, k, ta);
    }
    // The spread routing launches programmatically at every size (its blocks wait at their start; 0.3-0.5 µs faster).
    return spread ? launch_programmatic(true, route_spread_table_kernel<kPer>, dim3(static_cast<unsigned>(n_tok)),
                                        dim3(moe_route_dev::kThreads), 0, stream, l.logits, E, k, ta)
                  : launch_programmatic(pdl, route_table_kernel<kPer>, dim3(1), dim3(moe_route_dev::kThreads), 0,
                                        stream, l.logits, E, k, ta);
  }));
  ++launches;
  if (!f32_router) {
    KESTREL_TRY(gemv_imma_prepare_x(x, H, n_tok, l.xprep, stream));
    ++launches;
  }
  if (hooks != nullptr && hooks->after_route) KESTREL_TRY(hooks->after_route());

  // A hybrid layer with no resident expert and no shared expert has nothing for the GEMVs.
  const bool gemvs = h == nullptr || h->n_resident > 0 || w.has_shared_expert();
  // An expert (or a chunk of the shared expert) sees each token at most once: no segment holds more than n_tok.
  const int seg_bound = std::min(n_tok, c.chunk);
  if (gemvs) {
    // In a hybrid layer the gate+up GEMV follows the hand-off's publishing kernel: a plain launch.
    KESTREL_TRY(gemv_imma_segments(w.gate_up_type, H, I, l.seg_gu, c.n_seg_gu(), l.xprep, l.gu, I, stream, seg_bound,
                                   pdl && h == nullptr, used_gu, false, tuning.grouped_gemv));
    ++launches;
  }

  // SwiGLU inside the activations' preparation: gate row r at gu + r·I, up row r at gu + (n_all + r)·I. Its own launch:
  // inside the down GEMV it would be repeated in every down block (one launch fewer, but slower at every size).
  // The preparation lets the down GEMV launch only after its own wait (when programmatic; a plain launch starts after
  // the gate+up GEMV anyway): the gate+up GEMV, and the tables' writer before it, have completed, so the down GEMV —
  // programmatic at every size — reads its table and first weights before its own wait (table_settled), and the
  // combine its entries.
  if (gemvs) {
    KESTREL_TRY(gemv_imma_prepare_swiglu(l.gu, l.gu + static_cast<size_t>(c.n_all) * I, I, c.n_all, l.aprep, stream,
                                         pdl, true));
    ++launches;

    KESTREL_TRY(gemv_imma_segments(w.down_type, I, H, l.seg_dn, c.n_seg_dn(), l.aprep, l.ye, H, stream, seg_bound, true,
                                   used_dn, true, tuning.grouped_gemv));
    ++launches;
  }

  // The side read's experts, while the host's workers compute theirs; their rows of ye are the routing entries'.
  if (side_read) {
    MoeExpertGroups g;
    g.stacks = h->bus;
    g.n_groups = ta.bus_n;
    g.expert = ta.bus_expert;
    g.first = ta.bus_first;
    g.end = ta.bus_end;
    g.entry_token = ta.bus_token;
    g.out_entry = ta.bus_entry;
    // A token gives the bus at most round(k · share) choices (the routing's rounding, + 1 to spare), each an expert.
    const int per_token = static_cast<int>(std::floor(std::fmaf(static_cast<float>(k), h->bus_share, 0.5f))) + 1;
    g.max_groups = std::min(c.max_active, n_tok * std::min(k, per_token));
    g.n_tok = n_tok;
    g.x = x;
    g.h = l.bus_h;
    g.ye = l.ye;
    KESTREL_TRY(moe_expert_groups(g, stream));
    launches += 2;
  }

  if (hooks != nullptr && hooks->before_combine) KESTREL_TRY(hooks->before_combine());
  if (h != nullptr) {
    MoeHybridCombine hc;
    hc.ye = l.ye;
    hc.token_entry = r.token_entry;
    hc.entry_weight = r.entry_weight;
    hc.k = k;
    hc.host_y = h->host_y;
    hc.sh = w.has_shared_expert() ? l.ye + static_cast<size_t>(c.n_entries) * H : nullptr;
    hc.shared_gate_inp = w.shared_gate_inp;
    hc.x = x;
    hc.n_tok = n_tok;
    hc.h = H;
    hc.out = out;
    KESTREL_TRY(moe_hybrid_combine(hc, stream));
    ++launches;
    if (info != nullptr) {
      info->launches = launches;
      info->routing = r;
    }
    return ok_status();
  }

  const float* ye = l.ye;
  const int32_t* token_entry = r.token_entry;
  const float* entry_weight = r.entry_weight;
  const dim3 grid(static_cast<unsigned>((H + kCombineThreads - 1) / kCombineThreads), static_cast<unsigned>(n_tok));
  if (w.has_shared_expert()) {
    const auto* gate_inp = static_cast<const uint8_t*>(w.shared_gate_inp.data);
    KESTREL_TRY(dispatch_dequant_type(
        w.shared_gate_inp.type,
        [&](auto tag) -> Status {
          constexpr GgmlType T = decltype(tag)::value;
          return launch_programmatic(true, combine_kernel<T, true>, grid, dim3(kCombineThreads), 0, stream, ye,
                                     token_entry, entry_weight, k, c.n_entries, gate_inp, x, H, out);
        },
        unsupported("ffn_gate_inp_shexp type " + tname(w.shared_gate_inp.type))));
  } else {
    const uint8_t* no_gate = nullptr;
    KESTREL_TRY(launch_programmatic(true, combine_kernel<GgmlType::kF32, false>, grid, dim3(kCombineThreads), 0, stream,
                                    ye, token_entry, entry_weight, k, c.n_entries, no_gate, x, H, out));
  }
  ++launches;
  if (info != nullptr) {
    info->launches = launches;
    info->routing = r;
  }
  return ok_status();
}

}  // namespace

Status moe_imma_forward(const MoeImmaWeights& w, const float* x, int n_tok, float* out, void* workspace,
                        cudaStream_t stream, const MoeImmaTuning& tuning, MoeLaunchInfo* info,
                        const MoePhaseHooks* hooks) {
  return forward(w, x, n_tok, out, workspace, stream, tuning, info, nullptr, hooks);
}

Status moe_imma_forward_hybrid(const MoeImmaWeights& w, const MoeHybrid& h, const float* x, int n_tok, float* out,
                               void* workspace, cudaStream_t stream, const MoePhaseHooks& hooks,
                               const MoeImmaTuning& tuning, MoeLaunchInfo* info) {
  return forward(w, x, n_tok, out, workspace, stream, tuning, info, &h, &hooks);
}

Status moe_imma_route_inputs(const MoeImmaWeights& w, const float* x, int n_tok, float* logits, void* xprep,
                             cudaStream_t stream) {
  if (n_tok < 1 || n_tok > 65535) return bad("n_tok " + std::to_string(n_tok) + " outside [1, 65535]");
  if (router_prepares_x(w)) return router_logits_and_prepare(w, x, n_tok, logits, xprep, stream);
  const int64_t H = w.n_embd;
  const int64_t E = w.n_expert;
  for (int t0 = 0; t0 < n_tok; t0 += kMoeMaxTokens) {
    const int n = std::min(kMoeMaxTokens, n_tok - t0);
    KESTREL_TRY(router_logits_and_prepare(w, x + t0 * H, n, logits + t0 * E, nullptr, stream));
  }
  return gemv_imma_prepare_x(x, w.n_embd, n_tok, xprep, stream);
}

}  // namespace kestrel::gpu
