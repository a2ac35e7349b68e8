// gemv_imma (see gemv_imma.h): GEMV v4, re-tiled Q4_0 / Q4_K / Q5_K weights on u8 × s8 tensor-core MMAs, Q6_K / Q8_0
// on s8 × s8 (their multiplies: gpu/kernels/imma_tile.cuh; this head derives the Q4 types', which the others follow).
//
// MMA fragments (PTX mma.m16n8k32, 8-bit): lane = 4g + t; A regs {row g k 4t..4t+3, row g+8 k 4t.., row g k 16+4t..,
// row g+8 k 16+4t..}; B regs {k 4t..4t+3 col g, k 16+4t.. col g}; C {row g col 2t, 2t+1, row g+8 col 2t, 2t+1}.
// A tile word of lane t (tile_matrix) is bytes 4t..4t+3 of a block's 16 quant bytes: its low nibbles are elements 4t..,
// its high nibbles elements 16+4t.. (Q4_0; Q4_K: low nibbles sub-block 2j, high nibbles sub-block 2j+1, with the
// words of bytes 4t.. and 16+4t..). So `w & 0x0F0F0F0F` and `(w >> 4) & 0x0F0F0F0F` are A registers as they stand.
//
// Columns: MMA column c = 4·(vector of the pair) + digit. Lanes g < 4 load B of the pair's first vector (digit g),
// lanes g >= 4 of its second; lane t holds C columns 2t, 2t+1: digits 2(t&1), 2(t&1)+1 of vector t >> 1.
//
// Per 32-element block b (one MMA), with h = t & 1 and D = 128·Σd_2h + Σd_2h+1 over the block (prepared with x):
// a lane's two columns are joined exactly in int32 first, v = 128·c0 + c1 (|v − start| < 2^22), in units of digit
// 2h + 1, so each block costs one scaling per row.
//   Q4_0: c1 starts at 0x4B400000 − 8·D (the float 1.5·2^23 as an integer, minus the offset-8 term), so
//         float_bits(v) − 1.5·2^23 is Σ(q − 8)·(128·d_2h + d_2h+1) exactly; acc += that · d_b.
//   Q4_K: C starts at 0; I += v·sc and M += m·D in int32 over the super-block (|I| < 2^31), then acc = d·I − dmin·M.
// Per round (one row group × 256 columns): partial = s_G · acc · 128^−(2h+1), added over lane pairs t, t^1 (all four
// digits), then over the row group's warps in warp order.
//
// Memory: weights and scales for the next group are loaded into registers (ld.global.nc, no L1 allocation) before the
// current one is multiplied; a block is S·R warps (R row groups at once when S < 8) and blocks are persistent (as many
// as fit on the device), walking row groups gridDim.x·R apart (a counted table's: one run of consecutive row groups per
// block, so a segment's activations stay in the SM's L1). Prepared activations are loaded a unit at a time in each
// round (L1 hits after the first). Vectors beyond 8 are further segments of 8 (each reads the weights again, mostly
// from L2). Dense calls at one group per warp run the flat kernel instead (gemv_imma_flat_kernel: no rounds).
//
// The kernel is issue-bound more than bandwidth-bound: what moved it was fewer instructions per tile (immediate
// offsets, one scaling per block, a round's state found once), not deeper load queues or more warps — shared-memory
// stages, bulk-copy rings, L2 prefetches and register caps for more blocks each measured slower.
// dev/notes/gpu-kernels.md has the versions and their figures.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/imma_tile.cuh"
#include "gpu/kernels/ld_stream.cuh"
#include "gpu/kernels/pdl.cuh"

namespace kestrel::gpu {
namespace {

using imma_prep::kGroupElems;
using imma_prep::kUnitsPerSlice;
using imma_prep::PlainRows;
using imma_prep::SwigluRows;
using imma_prep::x_layout;
using imma_prep::XLayout;
using imma_tile::kTileRows;
using imma_tile::kUnitElems;
using imma_tile::multiply_add;
using imma_tile::pair_sum;
using imma_tile::WeightBuf;
using imma_tile::XSource;
constexpr int kMaxWarps = 16;
constexpr int kMaxVectors = 32;         // per gemv_imma call
constexpr int kMaxPrepVectors = 65535;  // per gemv_imma_prepare_x call (grid.y)

// ---- activation preparation -------------------------------------------------------------------------------------

// One warp per (vector, group of 256), four a block. kHold: the next kernel may launch only after the wait.
template <class Rows, bool kHold>
__global__ void __launch_bounds__(128) prepare_x_kernel(Rows rows, int n_cols, XLayout lay, uint8_t* __restrict__ out) {
  if constexpr (!kHold) pdl_trigger();
  pdl_wait();
  if constexpr (kHold) pdl_trigger();
  imma_prep::prepare_group(rows, n_cols, lay, out, static_cast<int>(blockIdx.y),
                           static_cast<int>(blockIdx.x * 4 + threadIdx.x / 32), static_cast<int>(threadIdx.x % 32));
}

// ---- the GEMV kernel --------------------------------------------------------------------------------------------

// x / d for x < 2^31 with a multiply: q = (umulhi(x, m) + x) >> s (the round-up method), m and s from the host.
struct FastDiv {
  uint32_t m = 1, s = 0;
  static FastDiv make(uint32_t d) {
    FastDiv f;
    while ((1ull << f.s) < d) ++f.s;
    f.m = static_cast<uint32_t>(((1ull << 32) * ((1ull << f.s) - d)) / d + 1);
    return f;
  }
  __device__ __forceinline__ int div(int x) const {
    return static_cast<int>((__umulhi(static_cast<uint32_t>(x), m) + static_cast<uint32_t>(x)) >> s);
  }
};

// The fields a warp reads before its first weight load come first, 48 bytes from the parameters' start (c[0x0][0x210]
// on sm_90): one 64-byte constant-cache line, so a launch's first warps wait for one line of them, not two.
struct KernelArgs {
  const void* base;   // dense: the matrix (segment s holds vectors 8s .. min(8s + 8, n_vec) - 1); else the table
  uint32_t meta_off;  // bytes from a tiled matrix's start to its scales (gemv_imma_supports: < 2^32)
  int n_vec;          // dense: vectors in all
  int n_seg;
  int n_units;     // units of 64 columns per row
  int n_rg;        // row groups per segment
  FastDiv rg_div;  // divides by n_rg
  int s_log;       // log2(S), S warps per row group (slices of gps groups)
  int gps;         // groups per slice
  int R;           // row groups per block and round
  int S;           // 1 << s_log (the host's)
  int n_groups;    // groups of 256 columns per row
  const uint8_t* xprep;
  XLayout lay;
  float* y;
  int64_t y_stride;
  const int32_t* n_used;  // kCount: the table's segments in use (device; n_seg bounds it)
  bool table;             // host: a grouped call (base is the table)
  bool settled;           // host: the table was final before the launch (gemv_imma_segments' table_settled)
};

// Segment s as the kernel sees it: from the device table (kTable; written by the kernel before, so read with ordinary
// loads, pdl.cuh) or computed for a dense call (no loads).
template <bool kTable>
struct Seg {
  const ImmaSegment* e;
  const void* data;
  int n_vec;
  int s;
  __device__ __forceinline__ Seg(const KernelArgs& a, int seg) : s(seg) {
    if constexpr (kTable) {
      e = static_cast<const ImmaSegment*>(a.base) + seg;
      data = reinterpret_cast<const void*>(ld_dep(reinterpret_cast<const unsigned long long*>(&e->data)));
      n_vec = ld_dep(&e->n_vec);
    } else {
      e = nullptr;
      data = a.base;
      n_vec = min(kImmaSegmentVectors, a.n_vec - seg * kImmaSegmentVectors);
    }
  }
  __device__ __forceinline__ int vec(int j) const {
    if constexpr (kTable) return ld_dep(&e->vec[j]);
    return s * kImmaSegmentVectors + j;
  }
  __device__ __forceinline__ int out(int j) const {
    if constexpr (kTable) return ld_dep(&e->out[j]);
    return s * kImmaSegmentVectors + j;
  }
};

// A warp's place in its stream: round (row-group item of the block) and group within the warp's slice.
struct Cursor {
  int round;
  int gi;
};

// The load side of a round: where the warp's row group of that round keeps the first group of its slice (lane's
// word and scales), found once per round; ok = false past the last item or for an empty segment (zeros then).
struct WRound {
  const uint8_t* qs;    // + kGroupQuantBytes<T> per group (Q4: 2048, + 512 per unit; imma_tile::tile_lane)
  const uint8_t* meta;  // + 256 per group (Q4_0, Q8_0: + 64 per unit; Q4_K, Q5_K: the super-block's heads, rows g + 8
                        // at + 128; Q6_K: + 288 per group, the rows' scales)
  int dgap;             // Q6_K: from meta to the rows' d
  bool ok;
};

// What the load side needs of a round's segment, read a round ahead (a table entry is a dependent load: reading it
// when the round starts would stall the warp in front of its first weight load).
struct SegHead {
  const void* data;
  int item;
  int seg;
  bool ok;  // item < n_items and the segment has vectors
};

template <bool kTable>
__device__ __forceinline__ SegHead seg_head(const KernelArgs& a, int item, int n_items) {
  SegHead h;
  h.item = item;
  h.ok = item < n_items;
  h.seg = h.ok ? a.rg_div.div(item) : 0;
  const Seg<kTable> sg(a, h.seg);
  h.ok = h.ok && sg.n_vec > 0;
  h.data = sg.data;
  return h;
}

template <GgmlType T>
__device__ __forceinline__ WRound w_round(const KernelArgs& a, const SegHead& h, int group0, int lane) {
  WRound r;
  r.ok = h.ok;
  const int rg = h.ok ? h.item - h.seg * a.n_rg : 0;
  const auto* base = static_cast<const uint8_t*>(h.data);
  imma_tile::tile_lane<T>(base, a.meta_off, a.n_units, rg, group0, lane, r.qs, r.meta);
  r.dgap = imma_tile::q6_d_delta(lane);
  return r;
}

// Group gi of the round's slice (column group `group`) into registers: whole groups without predicates; the row's
// last, partial group (Q4_0) and groups past the row's end or the last item read zeros where there is nothing.
template <GgmlType T, class Args>
__device__ __forceinline__ void w_load(const Args& a, const WRound& r, int gi, int group, WeightBuf& b) {
  if constexpr (T == GgmlType::kQ6_K) {  // whole super-blocks: a group is there or past the end
    const uint8_t* qs = r.qs + static_cast<size_t>(gi) * imma_tile::kGroupQuantBytes<T>;
    const uint8_t* meta = r.meta + static_cast<size_t>(gi) * imma_tile::kGroupMetaBytes<T>;
    const bool ok = r.ok && group < a.n_groups;
#pragma unroll
    for (int i = 0; i < kUnitsPerSlice; ++i) b.w[i] = ok ? ldg_stream(qs + i * 512) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      b.qh[p] = ok ? ldg_stream(qs + 2048 + p * 512) : make_uint4(0, 0, 0, 0);
      b.sc6[p] = ok ? ldg_stream(meta + p * 16) : make_uint4(0, 0, 0, 0);
    }
    b.d6 = ok ? ldg_stream1(meta + r.dgap) : 0u;
    return;
  }
  constexpr bool kKQuant = T == GgmlType::kQ4_K || T == GgmlType::kQ5_K;  // scales in super-block heads
  constexpr int kUnitBytes = T == GgmlType::kQ8_0 ? 1024 : 512;           // Q5_K: its high bits follow the units
  const uint8_t* qs = r.qs + static_cast<size_t>(gi) * imma_tile::kGroupQuantBytes<T>;
  const uint8_t* meta = r.meta + static_cast<size_t>(gi) * 256;
  const int left = a.n_units - group * kUnitsPerSlice;
  if (r.ok && left >= kUnitsPerSlice) {
#pragma unroll
    for (int i = 0; i < kUnitsPerSlice; ++i) {
      b.w[i] = ldg_stream(qs + i * kUnitBytes);
      if constexpr (T == GgmlType::kQ8_0) b.w2[i] = ldg_stream(qs + i * kUnitBytes + 512);
      if constexpr (!kKQuant) b.m0[i] = ldg_stream2(meta + i * 64);
    }
    if constexpr (kKQuant) {
      b.mk[0] = ldg_stream(meta);
      b.mk[1] = ldg_stream(meta + 128);
    }
    if constexpr (T == GgmlType::kQ5_K) b.h5 = ldg_stream(qs + 2048);
    return;
  }
#pragma unroll
  for (int i = 0; i < kUnitsPerSlice; ++i) {
    const bool u_ok = r.ok && i < left;
    b.w[i] = u_ok ? ldg_stream(qs + i * kUnitBytes) : make_uint4(0, 0, 0, 0);
    if constexpr (T == GgmlType::kQ8_0) b.w2[i] = u_ok ? ldg_stream(qs + i * kUnitBytes + 512) : make_uint4(0, 0, 0, 0);
    if constexpr (!kKQuant) b.m0[i] = u_ok ? ldg_stream2(meta + i * 64) : make_uint2(0, 0);
  }
  if constexpr (kKQuant) {
    const bool ok = r.ok && left > 0;
    b.mk[0] = ok ? ldg_stream(meta) : make_uint4(0, 0, 0, 0);
    b.mk[1] = ok ? ldg_stream(meta + 128) : make_uint4(0, 0, 0, 0);
    if constexpr (T == GgmlType::kQ5_K) b.h5 = ok ? ldg_stream(qs + 2048) : make_uint4(0, 0, 0, 0);
  }
}

__host__ __device__ constexpr int part_bytes(int warps) { return 2 * warps * kImmaSegmentVectors * kTileRows * 4; }

// One output's S slice partials (pr: the first, the next a warp's partials apart) added in warp order. All S are
// loaded before the first add, so the small calls' path has one shared-memory round trip here, not S.
__device__ __forceinline__ float sum_slices(const float* pr, int S) {
  float v[kMaxWarps];
#pragma unroll
  for (int s2 = 0; s2 < kMaxWarps; ++s2) v[s2] = s2 < S ? pr[s2 * kImmaSegmentVectors * kTileRows] : 0.0f;
  float sum = v[0];
#pragma unroll
  for (int s2 = 1; s2 < kMaxWarps; ++s2) sum = s2 < S ? __fadd_rn(sum, v[s2]) : sum;
  return sum;
}

// The cross-warp sum of a block's R row groups: y = the S slices' partials (part: [warp][vector slot][row]) added in
// warp order, each output by one thread of the block's S·R·32. item0: the block's first row-group item this round.
template <bool kTable, int NP>
__device__ __forceinline__ void add_slices(const KernelArgs& a, const float* part, int S, int R, int item0,
                                           int n_items) {
  for (int k = threadIdx.x; k < R * 2 * NP * kTileRows; k += S * R * 32) {
    const int r = k / (2 * NP * kTileRows);
    const int slot = (k / kTileRows) % (2 * NP);
    const int row = k % kTileRows;
    const int it = item0 + r;
    if (it >= n_items) continue;
    const int so_i = a.rg_div.div(it);
    const Seg<kTable> so(a, so_i);
    if (slot >= so.n_vec) continue;
    const float* pr = part + ((r * S) * kImmaSegmentVectors + slot) * kTileRows + row;
    a.y[static_cast<int64_t>(so.out(slot)) * a.y_stride + static_cast<int64_t>(it - so_i * a.n_rg) * kTileRows + row] =
        sum_slices(pr, S);
  }
}

// NP: most vector pairs per segment (1, 2 or 4). kMode, what the call reads: kDenseCall (a.base: the matrix),
// kTableCall (a.base: the table), kCountedCall (the table, only its first *a.n_used segments). kGps: the groups per
// slice (a.gps) compiled in, so that a round's groups unroll (0: a.gps at run time).
// kSettledCall / kSettledCountedCall: a table (and count) that was final before this kernel launched
// (gemv_imma_segments' table_settled), read like the dense call's matrix before the wait.
enum CallMode : int { kDenseCall = 0, kTableCall = 1, kCountedCall = 2, kSettledCall = 3, kSettledCountedCall = 4 };
template <GgmlType T, int NP, int kMode, int kGps>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_imma_kernel(KernelArgs a) {
  constexpr bool kTable = kMode != kDenseCall;
  constexpr bool kCount = kMode == kCountedCall || kMode == kSettledCountedCall;
  constexpr bool kWaitFirst = kTable && kMode != kSettledCall && kMode != kSettledCountedCall;
  // Dynamic shared memory: partial sums per warp when S > 1, double-buffered by round parity ([buf][warp][vector
  // slot][row], part_bytes()).
  extern __shared__ __align__(128) uint8_t smem[];
  // Under a programmatic launch (gpu/kernels/pdl.cuh) the next kernel may launch now. A dense call reads its resident
  // weights (which no kernel writes) before it waits for the kernel before it: the address arithmetic and the first
  // group's loads overlap that kernel's end. The table, the prepared x and y are touched only after the wait — but a
  // settled table (kSettledCall) is read before it, with the first round's entries and the first group's weights.
  pdl_trigger();
  if constexpr (kWaitFirst) pdl_wait();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int S = 1 << a.s_log;
  const int R = a.R;
  const int sl = warp & (S - 1);
  const int rl = warp >> a.s_log;
  // kCount: the table's segments in use (n_used) give the items, and each block takes one run of them, consecutive
  // row groups (mostly of one segment), so that a segment's activations stay in its SM's L1 from round to round;
  // n_items becomes the end of the block's run, and the first table entries wait for the count. Uncounted tables (and
  // dense calls) are walked round by round, gridDim.x · R items apart: their tail of empty segments would leave a
  // run's blocks idle.
  int n_items = a.n_seg * a.n_rg;
  int run0 = 0;  // kCount: the block's first item
  if constexpr (kCount) {
    n_items = max(0, min(a.n_seg, ld_dep(a.n_used))) * a.n_rg;
    const int slots = static_cast<int>(gridDim.x) * R;
    const int per = (n_items + slots - 1) / slots * R;
    run0 = static_cast<int>(blockIdx.x) * per;
    n_items = min(n_items, run0 + per);
  }
  float* part = reinterpret_cast<float*>(smem);
  auto item_of = [&](int round) {
    if constexpr (kCount) return run0 + round * R;
    return (round * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x)) * R;
  };
  const int gps = kGps > 0 ? kGps : a.gps;
  const int group0 = sl * gps;  // the warp's first group in every round
  auto next = [&](Cursor c) { return c.gi + 1 < gps ? Cursor{c.round, c.gi + 1} : Cursor{c.round + 1, 0}; };

  float acc[NP][2];
#pragma unroll
  for (int p = 0; p < NP; ++p) acc[p][0] = acc[p][1] = 0.0f;

  // The compute side of the current round (set when its first group comes): the item, its segment, and per pair the
  // lane's activation pointers at group0.
  int item = 0, seg = 0, n_vec = 0;
  // NP == 1 keeps the pair's two pointers; more pairs keep the two vector indices (fewer registers: no spills) and
  // form the pointers per group. foff / doff: the lane's offsets at group0 within a vector's frag / dsum regions.
  using XRef = std::conditional_t<NP == 1, const uint8_t*, int>;
  XRef xf[NP];
  XRef xd[NP];
  const size_t foff = imma_tile::x_frag_off(group0, g, t);
  const size_t doff = imma_tile::x_dsum_off(a.lay, group0, t);
  // A group's scale lies at its dsum pointer + sdelta (group0's dsum at (t % 2)·8 + 64·group0 past the region's
  // start, its scale at dsum_bytes + 4·group0), stepping 4 bytes per group where the dsum steps 64.
  const int64_t sdelta = static_cast<int64_t>(a.lay.dsum_bytes()) - (t % 2) * 8 - 60 * static_cast<int64_t>(group0);
  auto x_round = [&](int round) {
    item = item_of(round) + rl;
    const bool item_ok = item < n_items;
    seg = item_ok ? a.rg_div.div(item) : 0;
    const Seg<kTable> sg(a, seg);
    n_vec = item_ok ? sg.n_vec : 0;
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      if (2 * p < n_vec) {
        const int va = sg.vec(2 * p);
        const int vb = 2 * p + 1 < n_vec ? sg.vec(2 * p + 1) : va;
        const int vf = g < 4 ? va : vb;
        const int vd = t < 2 ? va : vb;
        if constexpr (NP == 1) {
          xf[p] = a.xprep + static_cast<size_t>(vf) * a.lay.vec_bytes() + foff;
          xd[p] = a.xprep + static_cast<size_t>(vd) * a.lay.vec_bytes() + doff;
        } else {
          xf[p] = vf;
          xd[p] = vd;
        }
      }
    }
  };

  auto step = [&](const WeightBuf& wb, const Cursor& c) {
    if (c.gi == 0) x_round(c.round);
    if (group0 + c.gi < a.n_groups) {
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        if (2 * p < n_vec) {
          const uint8_t* pf;
          const uint8_t* pd;
          if constexpr (NP == 1) {
            pf = xf[p], pd = xd[p];
          } else {
            pf = a.xprep + static_cast<size_t>(xf[p]) * a.lay.vec_bytes() + foff;
            pd = a.xprep + static_cast<size_t>(xd[p]) * a.lay.vec_bytes() + doff;
          }
          const XSource x{pf + static_cast<size_t>(c.gi) * kUnitsPerSlice * 256,
                          pd + static_cast<size_t>(c.gi) * kUnitsPerSlice * 16, pd + sdelta + c.gi * 4};
          multiply_add<T>(wb, x, acc[p]);
        }
      }
    }
    if (c.gi + 1 < gps) return;
#pragma unroll
    for (int p = 0; p < NP; ++p) pair_sum(acc[p], lane);
    // The row group's last group of this slice: write y (S == 1) or add the slices in warp order (S > 1).
    if (S == 1) {
      const Seg<kTable> sg(a, seg);
      const int rg = item - seg * a.n_rg;
      if (t % 2 == 0) {
#pragma unroll
        for (int p = 0; p < NP; ++p) {
          const int slot = 2 * p + t / 2;
          if (slot < n_vec) {
            float* yo = a.y + static_cast<int64_t>(sg.out(slot)) * a.y_stride + static_cast<int64_t>(rg) * kTileRows;
            yo[g] = acc[p][0];
            yo[g + 8] = acc[p][1];
          }
        }
      }
    } else {
      const int buf = c.round & 1;
      if (t % 2 == 0) {
#pragma unroll
        for (int p = 0; p < NP; ++p) {
          float* pw = part + ((buf * S * R + warp) * kImmaSegmentVectors + 2 * p + t / 2) * kTileRows;
          pw[g] = acc[p][0];
          pw[g + 8] = acc[p][1];
        }
      }
      __syncthreads();
      add_slices<kTable, NP>(a, part + buf * S * R * kImmaSegmentVectors * kTileRows, S, R, item_of(c.round), n_items);
    }
#pragma unroll
    for (int p = 0; p < NP; ++p) acc[p][0] = acc[p][1] = 0.0f;
  };

  if (item_of(0) >= n_items) return;
  SegHead first = seg_head<kTable>(a, item_of(0) + rl, n_items);  // this round's
  SegHead ahead = seg_head<kTable>(a, item_of(1) + rl, n_items);  // the next round's
  // Two register buffers: the next group's weights are in flight while this one is multiplied.
  Cursor cur{0, 0};
  WRound wr = w_round<T>(a, first, group0, lane);
  WeightBuf b0, b1;
  w_load<T>(a, wr, 0, group0, b0);
  if constexpr (!kWaitFirst) pdl_wait();
  auto load_next = [&](const Cursor& nx, WeightBuf& b) {
    if (nx.gi == 0) {
      wr = w_round<T>(a, ahead, group0, lane);
      ahead = seg_head<kTable>(a, item_of(nx.round + 1) + rl, n_items);
    }
    w_load<T>(a, wr, nx.gi, group0 + nx.gi, b);
  };
  if constexpr (kGps > 0) {
    // Whole rounds per iteration, unrolled (two when kGps is odd, so that every iteration starts on b0): the cursor,
    // the per-group pointer steps and the round's branches are compile-time.
    constexpr int kSteps = kGps % 2 == 0 ? kGps : 2 * kGps;
    for (int round = 0;; round += kSteps / kGps) {
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        const Cursor c{round + k / kGps, k % kGps};
        const Cursor nx = next(c);
        load_next(nx, k % 2 == 0 ? b1 : b0);
        step(k % 2 == 0 ? b0 : b1, c);
        if (k % kGps == kGps - 1 && item_of(nx.round) >= n_items) return;
      }
    }
  } else {
    for (;;) {
      Cursor nx = next(cur);
      load_next(nx, b1);
      step(b0, cur);
      cur = nx;
      if (item_of(cur.round) >= n_items) break;
      nx = next(cur);
      load_next(nx, b0);
      step(b1, cur);
      cur = nx;
      if (item_of(cur.round) >= n_items) break;
    }
  }
}

// The flat kernel's parameters: everything read before the first loads in the first 48 bytes (one constant-cache
// line, as KernelArgs).
struct FlatArgs {
  const void* w;  // the tiled matrix
  const uint8_t* xprep;
  uint32_t meta_off;
  int n_units;
  int n_groups;
  int n_rg;
  int s_log;
  int R;
  int n_vec;  // 1..32: segments of 8 (grid.y)
  float* y;
  int64_t y_stride;
};

// The flat kernel: a dense call at one group per warp, its segments of up to 8 vectors along grid.y — no rounds,
// nothing loaded ahead: a warp's first load is addressed from its block and place. NP = 1 (1-2 vectors) at two blocks
// of 16 warps an SM (64 registers; the persistent kernel's 120+ allow one), so the split's rule (pick_split: one group
// per warp up to kWaveWarps warps) puts the <= 9.4 MB projections in one wave (Q4_0's lm_head: one group per warp in
// ~30 waves); NP = 2, 4 at one block an SM, in as many waves as the grid needs. The same operations in the
// same order as gemv_imma_kernel at the same S, so the same bits (test_gemv_imma compares them). kXFirst (plain
// launches of one pair): the activations are loaded into registers before the weights — they come from L2 and, issued
// after the weights, queue behind them (ncu: 16-20% of the 9.4 MB projection's stall samples waited on them); a
// programmatic launch must load its weights first, before its wait, and x after it.
template <GgmlType T, int NP, bool kXFirst>
__global__ void __launch_bounds__(kMaxWarps * 32, NP == 1 ? 2 : 1) gemv_imma_flat_kernel(FlatArgs a) {
  static_assert(!kXFirst || NP == 1, "x ahead of the weights only for one pair");
  extern __shared__ __align__(128) uint8_t smem[];
  pdl_trigger();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int S = 1 << a.s_log;
  const int sl = warp & (S - 1);
  const int item = static_cast<int>(blockIdx.x) * a.R + (warp >> a.s_log);
  const bool ok = item < a.n_rg && sl < a.n_groups;
  const XLayout lay{a.n_groups};
  // Segment blockIdx.y: vectors v0 .. v0 + n_vec - 1 (a dense call's segments of 8, as the persistent kernel's). One
  // pair is one segment (1-2 vectors): compiled out there, where two more registers would spill under the 64-register
  // bound.
  const int v0 = NP == 1 ? 0 : static_cast<int>(blockIdx.y) * kImmaSegmentVectors;
  const int n_vec = NP == 1 ? a.n_vec : min(kImmaSegmentVectors, a.n_vec - v0);
  // Pair p's activations for this warp's group (the group clamped into the row: its loads stay inside x).
  auto x_of = [&](int p) {
    const int grp = min(sl, a.n_groups - 1);
    const int vb = v0 + (2 * p + 1 < n_vec ? 2 * p + 1 : 2 * p);
    const size_t vf = g < 4 ? v0 + 2 * p : vb;
    const size_t vd = t < 2 ? v0 + 2 * p : vb;
    return XSource{a.xprep + vf * lay.vec_bytes() + imma_tile::x_frag_off(grp, g, t),
                   a.xprep + vd * lay.vec_bytes() + imma_tile::x_dsum_off(lay, grp, t),
                   a.xprep + vd * lay.vec_bytes() + imma_tile::x_scale_off(lay, grp)};
  };
  WRound r;
  r.ok = item < a.n_rg;
  r.dgap = imma_tile::q6_d_delta(lane);
  imma_tile::tile_lane<T>(static_cast<const uint8_t*>(a.w), a.meta_off, a.n_units, r.ok ? item : 0, sl, lane, r.qs,
                          r.meta);
  float acc[NP][2];
#pragma unroll
  for (int p = 0; p < NP; ++p) acc[p][0] = acc[p][1] = 0.0f;
  WeightBuf b;
  if constexpr (kXFirst) {
    pdl_wait();  // a plain launch: no wait
    const imma_tile::XRegs<T> x(x_of(0));
    w_load<T>(a, r, 0, sl, b);
    if (ok) multiply_add<T>(b, x, acc[0]);
  } else {
    w_load<T>(a, r, 0, sl, b);
    pdl_wait();
    if (ok) {
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        if (2 * p < n_vec) multiply_add<T>(b, x_of(p), acc[p]);
      }
    }
  }
#pragma unroll
  for (int p = 0; p < NP; ++p) pair_sum(acc[p], lane);
  if (S == 1) {
    if (r.ok && t % 2 == 0) {
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        const int slot = 2 * p + t / 2;
        if (slot < n_vec) {
          float* yo = a.y + static_cast<int64_t>(v0 + slot) * a.y_stride + static_cast<int64_t>(item) * kTileRows;
          yo[g] = acc[p][0];
          yo[g + 8] = acc[p][1];
        }
      }
    }
    return;
  }
  float* part = reinterpret_cast<float*>(smem);
  if (t % 2 == 0) {
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      float* pw = part + (warp * kImmaSegmentVectors + 2 * p + t / 2) * kTileRows;
      pw[g] = acc[p][0];
      pw[g + 8] = acc[p][1];
    }
  }
  __syncthreads();
  // The block's outputs, each the sum of its S slices in warp order (add_slices' order).
  const int item0 = static_cast<int>(blockIdx.x) * a.R;
  for (int k = threadIdx.x; k < a.R * 2 * NP * kTileRows; k += S * a.R * 32) {
    const int rr = k / (2 * NP * kTileRows);
    const int slot = (k / kTileRows) % (2 * NP);
    const int row = k % kTileRows;
    if (item0 + rr >= a.n_rg || slot >= n_vec) continue;
    const float* pr = part + ((rr * S) * kImmaSegmentVectors + slot) * kTileRows + row;
    a.y[static_cast<int64_t>(v0 + slot) * a.y_stride + static_cast<int64_t>(item0 + rr) * kTileRows + row] =
        sum_slices(pr, S);
  }
}

// ---- launch -----------------------------------------------------------------------------------------------------

bool aligned(const void* p, uintptr_t al) { return (reinterpret_cast<uintptr_t>(p) % al) == 0; }

// Grouped calls (a table) keep their row groups whole for up to 4 groups per warp: each segment entry is read from
// the table once per row group and its matrix streamed, instead of a table read in front of every group.
int grouped_split(int n_groups) {
  int S = 1;
  while (S < kMaxWarps && (n_groups + S - 1) / S > 4) S *= 2;
  return S;
}

constexpr int kWaveWarps = 4096;  // the flat kernel's one-vector-pair form: 32 warps an SM, 4224 on the H200's 132 SMs

// The split of a row: S warps per row group, each streaming gps groups of 256 columns. Matrices with enough row
// groups to fill the device take S = 1 (no cross-warp sum, no block barrier); smaller ones split their rows further
// so that ~2048 warps stream at once. Depends only on the matrix shape (so y[v] does not depend on n_vec), unless
// GemvImmaTuning::split forces S.
void pick_split(KernelArgs& a, GgmlType type, bool table, const GemvImmaTuning& tuning) {
  constexpr int kWantWarps = 2048;
  int S = 1;
  if (table) {
    S = grouped_split(a.n_groups);
  } else {
    while (S < a.n_groups && S < kMaxWarps && static_cast<int64_t>(a.n_rg) * S < kWantWarps) S *= 2;
    // One group per warp when that is at most kWaveWarps warps (gemv_imma_flat_kernel: one wave at 1-2 vectors), and
    // for Q4_0 at any height, in as many waves as it takes (lm_head Q4_0: 2-5% faster chained and at batch 8-32 than
    // S = 1, the same alone); Q4_K measured slower so and keeps the persistent kernel on tall matrices.
    int s1 = S;
    while (s1 < a.n_groups) s1 *= 2;
    const bool one_wave = static_cast<int64_t>(a.n_rg) * s1 <= kWaveWarps;
    if (s1 <= kMaxWarps && (one_wave || type == GgmlType::kQ4_0)) S = s1;
  }
  if (const int f = tuning.split; f > 0) {
    S = 1;
    while (2 * S <= std::min(f, kMaxWarps)) S *= 2;
  }
  a.S = S;
  a.s_log = std::countr_zero(static_cast<unsigned>(S));
  a.gps = (a.n_groups + S - 1) / S;
  // Grouped calls in blocks of 4 warps (R = 4 / S): the same warps per SM in smaller blocks, 1 µs faster at 8 and 32
  // tokens of moe_imma. Their S follows the shape only, never the batch (S orders the sums, so a token's bits would
  // follow its batch).
  a.R = table ? std::max(1, 4 / S) : std::max(1, 8 / S);
}

template <GgmlType T, int NP, int kMode, int kGps>
Status launch(const KernelArgs& args, bool programmatic, cudaStream_t stream) {
  const int warps = args.S * args.R;
  const size_t smem = part_bytes(warps);
  static int per_sm[kMaxWarps + 1] = {};  // blocks per SM by warps per block (a benign race: the same value)
  static int sm_count = 0;
  if (per_sm[warps] == 0) {
    int dev = 0;
    KESTREL_CUDA_TRY(cudaGetDevice(&dev));
    KESTREL_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev));
    int n = 0;
    KESTREL_CUDA_TRY(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_imma_kernel<T, NP, kMode, kGps>, warps * 32, smem));
    per_sm[warps] = std::max(1, n);
  }
  const int64_t items = static_cast<int64_t>(args.n_seg) * args.n_rg;
  const int64_t want = (items + args.R - 1) / args.R;
  const int64_t fit = static_cast<int64_t>(per_sm[warps]) * sm_count;
  return launch_programmatic(programmatic, gemv_imma_kernel<T, NP, kMode, kGps>,
                             dim3(static_cast<unsigned>(std::min(want, fit))), dim3(warps * 32), smem, stream, args);
}

// A dense call at one group per warp: the flat kernel (false otherwise: the caller launches the persistent one), for
// any number of segments of 8 vectors (the persistent kernel would step them a group at a time).
template <GgmlType T>
Expected<bool> launch_flat(const KernelArgs& args, int max_vec, bool programmatic, const GemvImmaTuning& tuning,
                           cudaStream_t stream) {
  if (args.table || args.gps != 1 || !tuning.flat_kernel) return false;
  FlatArgs f{};
  f.w = args.base;
  f.xprep = args.xprep;
  f.meta_off = args.meta_off;
  f.n_units = args.n_units;
  f.n_groups = args.n_groups;
  f.n_rg = args.n_rg;
  f.s_log = args.s_log;
  f.R = args.R;
  f.n_vec = args.n_vec;
  f.y = args.y;
  f.y_stride = args.y_stride;
  const int warps = args.S * args.R;
  const size_t smem = part_bytes(warps) / 2;
  const dim3 grid(static_cast<unsigned>((args.n_rg + args.R - 1) / args.R), static_cast<unsigned>(args.n_seg));
  const dim3 block(warps * 32);
  // x ahead of the weights for plain launches of rows of up to 8 groups (S <= 8): the 9.4 MB projections 6-9% faster,
  // but the 4096-column ones (S = 16, one block of 16 warps an SM) slower. Not Q8_0: its twice as many weight registers
  // would spill under the 64-register bound.
  constexpr bool kXFirstType = T != GgmlType::kQ8_0;
  void (*kernel)(FlatArgs) = gemv_imma_flat_kernel<T, 4, false>;
  if (max_vec <= 2) {
    const bool x_first = !programmatic && args.S <= 8;
    kernel = x_first ? gemv_imma_flat_kernel<T, 1, kXFirstType> : gemv_imma_flat_kernel<T, 1, false>;
  } else if (max_vec <= 4) {
    kernel = gemv_imma_flat_kernel<T, 2, false>;
  }
  KESTREL_TRY(launch_programmatic(programmatic, kernel, grid, block, smem, stream, f));
  return true;
}

// The groups per slice compiled in for 2, 4 and 8 (the presets' shapes), else read at run time (GemvImmaTuning::
// compiled_groups false: always). One group per slice stays on the run-time loop: unrolled (two rounds an iteration)
// its 0.6 MB matrices were slower. The two- and four-pair kernels (3-8 vectors) only for 2 groups per slice: unrolled
// deeper they spill (56-268 bytes).
template <GgmlType T, int NP, int kMode>
Status launch_gps(const KernelArgs& args, bool programmatic, const GemvImmaTuning& tuning, cudaStream_t stream) {
  const int gps = tuning.compiled_groups ? args.gps : 0;
  if (gps == 2) return launch<T, NP, kMode, 2>(args, programmatic, stream);
  if constexpr (NP == 1) {
    if (gps == 4) return launch<T, NP, kMode, 4>(args, programmatic, stream);
    if (gps == 8) return launch<T, NP, kMode, 8>(args, programmatic, stream);
  }
  return launch<T, NP, kMode, 0>(args, programmatic, stream);
}

template <GgmlType T, int kMode>
Status launch_pairs(const KernelArgs& args, int max_vec, bool programmatic, const GemvImmaTuning& tuning,
                    cudaStream_t stream) {
  if (max_vec <= 2) return launch_gps<T, 1, kMode>(args, programmatic, tuning, stream);
  if (max_vec <= 4) return launch_gps<T, 2, kMode>(args, programmatic, tuning, stream);
  return launch_gps<T, 4, kMode>(args, programmatic, tuning, stream);
}

template <GgmlType T>
Status launch_mode(const KernelArgs& args, int max_vec, bool programmatic, const GemvImmaTuning& tuning,
                   cudaStream_t stream) {
  if (!args.table) {
    KESTREL_TRY_ASSIGN(const bool flat, launch_flat<T>(args, max_vec, programmatic, tuning, stream));
    if (flat) return ok_status();
    return launch_pairs<T, kDenseCall>(args, max_vec, programmatic, tuning, stream);
  }
  // A settled table under a programmatic launch: only for one vector pair (moe_imma's programmatic calls; the other
  // forms would double their kernels for calls that never come).
  if (args.settled && programmatic && max_vec <= 2) {
    if (args.n_used != nullptr) return launch_gps<T, 1, kSettledCountedCall>(args, programmatic, tuning, stream);
    return launch_gps<T, 1, kSettledCall>(args, programmatic, tuning, stream);
  }
  if (args.n_used == nullptr) return launch_pairs<T, kTableCall>(args, max_vec, programmatic, tuning, stream);
  return launch_pairs<T, kCountedCall>(args, max_vec, programmatic, tuning, stream);
}

Status launch_any(GgmlType type, const KernelArgs& args, int max_vec, bool programmatic, const GemvImmaTuning& tuning,
                  cudaStream_t stream) {
  if (type == GgmlType::kQ4_0) return launch_mode<GgmlType::kQ4_0>(args, max_vec, programmatic, tuning, stream);
  if (type == GgmlType::kQ5_K) return launch_mode<GgmlType::kQ5_K>(args, max_vec, programmatic, tuning, stream);
  if (type == GgmlType::kQ6_K) return launch_mode<GgmlType::kQ6_K>(args, max_vec, programmatic, tuning, stream);
  if (type == GgmlType::kQ8_0) return launch_mode<GgmlType::kQ8_0>(args, max_vec, programmatic, tuning, stream);
  return launch_mode<GgmlType::kQ4_K>(args, max_vec, programmatic, tuning, stream);
}

KernelArgs base_args(GgmlType type, int64_t n_cols, int64_t n_rows, const void* xprep, float* y, int64_t y_stride) {
  KernelArgs a{};
  const int64_t n_rg = n_rows / kTileRows;
  const int64_t n_units = n_cols / kUnitElems;
  a.n_units = static_cast<int>(n_units);
  a.n_groups = static_cast<int>((n_units + kUnitsPerSlice - 1) / kUnitsPerSlice);
  a.n_rg = static_cast<int>(n_rg);
  a.rg_div = FastDiv::make(static_cast<uint32_t>(n_rg));
  a.meta_off = static_cast<uint32_t>(tiled_meta_offset(type, n_cols, n_rows));
  a.xprep = static_cast<const uint8_t*>(xprep);
  a.lay = x_layout(n_cols);
  a.y = y;
  a.y_stride = y_stride;
  return a;
}

}  // namespace

bool gemv_imma_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  return tiled_supports(type, n_cols, n_rows) && n_cols <= kImmaMaxCols &&
         tiled_bytes(type, n_cols, n_rows) <= UINT32_MAX;  // KernelArgs::meta_off
}

uint64_t imma_x_bytes(int64_t n_cols, int n_vec) {
  if (n_cols <= 0 || n_cols % kUnitElems != 0 || n_cols > kImmaMaxCols || n_vec < 1 || n_vec > kMaxPrepVectors) {
    return 0;
  }
  return static_cast<uint64_t>(n_vec) * x_layout(n_cols).vec_bytes();
}

namespace {

// The shared checks and launch of gemv_imma_prepare_x / gemv_imma_prepare_swiglu; `inputs` are the row pointers.
template <class Rows>
Status prepare(const char* name, Rows rows, std::initializer_list<const float*> inputs, int64_t n_cols, int n_vec,
               void* xprep, bool programmatic, bool hold, cudaStream_t stream) {
  if (imma_x_bytes(n_cols, n_vec) == 0) {
    return make_error(ErrorCode::kInvalidArgument, std::string(name) + ": n_cols " + std::to_string(n_cols) +
                                                       " (a multiple of 64 up to " + std::to_string(kImmaMaxCols) +
                                                       ") or n_vec " + std::to_string(n_vec) +
                                                       " (1..65535) out of range");
  }
  bool ok = xprep != nullptr && aligned(xprep, 16);
  for (const float* p : inputs) ok = ok && p != nullptr && aligned(p, 16);
  if (!ok)
    return make_error(ErrorCode::kInvalidArgument, std::string(name) + ": null or misaligned pointer (16 bytes)");
  const XLayout lay = x_layout(n_cols);
  const dim3 grid(static_cast<unsigned>((lay.n_groups + 3) / 4), static_cast<unsigned>(n_vec));
  return launch_programmatic(programmatic, hold ? prepare_x_kernel<Rows, true> : prepare_x_kernel<Rows, false>, grid,
                             dim3(128), 0, stream, rows, static_cast<int>(n_cols), lay, static_cast<uint8_t*>(xprep));
}

}  // namespace

Status gemv_imma_prepare_x(const float* x, int64_t n_cols, int n_vec, void* xprep, cudaStream_t stream) {
  return prepare("gemv_imma_prepare_x", PlainRows{x}, {x}, n_cols, n_vec, xprep, false, false, stream);
}

Status gemv_imma_prepare_swiglu(const float* gate, const float* up, int64_t n_cols, int n_vec, void* xprep,
                                cudaStream_t stream, bool programmatic, bool hold_dependents) {
  return prepare("gemv_imma_prepare_swiglu", SwigluRows{gate, up}, {gate, up}, n_cols, n_vec, xprep, programmatic,
                 hold_dependents, stream);
}

Status imma_dense_pointers_check(const char* op, const TiledView& w, const void* xprep, int n_vec, const float* y) {
  if (w.data == nullptr || xprep == nullptr || y == nullptr || !aligned(w.data, 16) || !aligned(xprep, 16) ||
      !aligned(y, 4)) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(op) + ": null or misaligned pointer (w and xprep need 16 bytes, y 4)");
  }
  const auto x0 = reinterpret_cast<uintptr_t>(xprep);
  const auto y0 = reinterpret_cast<uintptr_t>(y);
  const auto x1 = x0 + imma_x_bytes(w.n_cols, n_vec);
  const auto y1 = y0 + static_cast<uintptr_t>(n_vec) * static_cast<uintptr_t>(w.n_rows) * sizeof(float);
  if (x0 < y1 && y0 < x1) return make_error(ErrorCode::kInvalidArgument, std::string(op) + ": y overlaps xprep");
  return ok_status();
}

Status gemv_imma(const TiledView& w, const void* xprep, int n_vec, float* y, cudaStream_t stream, bool programmatic,
                 const GemvImmaTuning& tuning) {
  if (!gemv_imma_supports(w.type, w.n_cols, w.n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "gemv_imma: " + std::string(ggml_type_name(w.type)) + " {" +
                                                       std::to_string(w.n_cols) + ", " + std::to_string(w.n_rows) +
                                                       "} is not a shape it takes (gemv_imma_supports)");
  }
  if (n_vec < 1 || n_vec > kMaxVectors) {
    return make_error(ErrorCode::kInvalidArgument, "gemv_imma: n_vec " + std::to_string(n_vec) + " is outside [1, 32]");
  }
  KESTREL_TRY(imma_dense_pointers_check("gemv_imma", w, xprep, n_vec, y));
  KernelArgs args = base_args(w.type, w.n_cols, w.n_rows, xprep, y, w.n_rows);
  args.table = false;
  args.n_used = nullptr;
  args.base = w.data;
  args.n_vec = n_vec;
  args.n_seg = (n_vec + kImmaSegmentVectors - 1) / kImmaSegmentVectors;
  pick_split(args, w.type, false, tuning);
  return launch_any(w.type, args, std::min(n_vec, kImmaSegmentVectors), programmatic, tuning, stream);
}

Status gemv_imma_segments(GgmlType type, int64_t n_cols, int64_t n_rows, const ImmaSegment* segments, int n_segments,
                          const void* xprep, float* y, int64_t y_stride, cudaStream_t stream, int max_segment_vectors,
                          bool programmatic, const int32_t* n_used, bool table_settled, const GemvImmaTuning& tuning) {
  if (!gemv_imma_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "gemv_imma_segments: " + std::string(ggml_type_name(type)) + " {" +
                                                       std::to_string(n_cols) + ", " + std::to_string(n_rows) +
                                                       "} is not a shape it takes (gemv_imma_supports)");
  }
  if (n_segments < 0 || (n_segments > 0 && segments == nullptr) || xprep == nullptr || y == nullptr ||
      !aligned(xprep, 16) || !aligned(y, 4) || y_stride < n_rows || max_segment_vectors < 1 ||
      max_segment_vectors > kImmaSegmentVectors) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemv_imma_segments: bad table, pointer (xprep 16-byte aligned, y 4), max_segment_vectors " +
                          std::to_string(max_segment_vectors) + " (1..8) or y_stride " + std::to_string(y_stride) +
                          " < n_rows " + std::to_string(n_rows));
  }
  if (n_segments == 0) return ok_status();
  KernelArgs args = base_args(type, n_cols, n_rows, xprep, y, y_stride);
  args.table = true;
  args.base = segments;
  args.n_used = n_used;
  args.settled = table_settled;
  args.n_seg = n_segments;
  pick_split(args, type, true, tuning);
  return launch_any(type, args, max_segment_vectors, programmatic, tuning, stream);
}

}  // namespace kestrel::gpu
