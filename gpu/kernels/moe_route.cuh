// moe_route.cuh: the device side of moe_route (see moe_router.h), for kernels that route inside a larger block
// program (moe_router.cu's own kernel, moe_imma's route-and-tables kernel). One block of kThreads (1024) threads.
//
// Phase 1, warp w routes tokens w, w + kWarps, ...: lane l holds the token's logits l, l + 32, ... in registers
// (kPer of them: 8 up to E = 256, 16 up to 512, else 32), max by lane-strided max + butterfly (exact), p_e = expf(l_e −
// max), Σ lane-strided (index order within a lane) + butterfly, p_e /= Σ; then k rounds of arg-max over the
// not-yet-taken experts: each lane's best (the lowest index among its equals), the warp's largest p by one
// max-reduction of its bits and the lowest index holding it by one min-reduction (the reference's total order: larger
// p, then lower index), the winner's register set to −1. Every lane sums the k selected p in selection order and lane j
// divides its selection's p by the clamped sum. The logits stay in registers: in shared memory, with a butterfly per
// round, the routing of one token cost more than the layer's expert GEMVs. Phase 2 (after a barrier), the grouping, a
// thread per entry and a thread per expert: entry (t, j) sets bit t of its expert's token mask (shared-memory atomicOr;
// the result does not depend on the order); expert e's count is the mask's population, its entries start at the
// exclusive scan (cub::BlockScan) of the counts and its rank among the active experts at the scan of the flags (one
// scan of both, packed count | flag << 16: each total is at most 1024); entry (t, j) lands at its expert's start + the
// tokens below t in the mask, and its slot in the token's list at the number of the token's experts with a lower id. (A
// scan of all n_tok·k ids per expert keeps one warp of the block busy at a time: 49 µs at 32 tokens.) route_spread runs
// phase 1 in a block per token and phase 2 in the last block to finish (moe_imma uses it from
// MoeImmaTuning::route_spread_min_tokens tokens).
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "gpu/kernels/moe_router.h"
#include "gpu/kernels/pdl.cuh"
#include "gpu/kernels/warp_arrive.cuh"

namespace kestrel::gpu::moe_route_dev {

constexpr int kWarps = 32;  // one warp per token for up to kMoeMaxTokens tokens (phase 1 runs them all at once)
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr float kWeightSumMin = 6.103515625e-5f;  // 2^-14, as ref::kMoeWeightSumMin
static_assert(kThreads >= kMoeMaxExperts, "phase 2 gives each expert a thread");

// Logit e of lg: in global memory written by the kernel before (an ordinary load, pdl.cuh's ld_dep), or staged in
// shared memory.
__device__ __forceinline__ float logit_at(const float* lg, int e) { return __isGlobal(lg) ? ld_dep(lg + e) : lg[e]; }

// Routes token t's logits lg (n_expert of them) by one warp; lane j < k receives selection j (id, p).
template <int kPer>
__device__ __forceinline__ void route_token(const float* lg, int n_expert, int k, int lane, int& my_id, float& my_p,
                                            float& sel_sum) {
  float v[kPer];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n_expert ? logit_at(lg, e) : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (lane + 32 * i < n_expert) {
      v[i] = expf(__fsub_rn(v[i], mx));
      sum = __fadd_rn(sum, v[i]);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(kFullMask, sum, off));
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = lane + 32 * i < n_expert ? __fdiv_rn(v[i], sum) : -1.0f;  // taken: −1

  sel_sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best_p = -1.0f;
    int best_e = n_expert;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (v[i] > best_p) {  // strict: the lowest index among equals within the lane
        best_p = v[i];
        best_e = lane + 32 * i;
      }
    }
    // Every p is >= 0 (or −1: taken or absent): the bits of a non-negative float order like the float, + 1 keeps 0
    // for "nothing here".
    const unsigned key = best_p >= 0.0f ? __float_as_uint(best_p) + 1u : 0u;
    const unsigned top = __reduce_max_sync(kFullMask, key);
    const int win = static_cast<int>(__reduce_min_sync(kFullMask, key == top ? static_cast<unsigned>(best_e) : ~0u));
    const float win_p = top > 0u ? __uint_as_float(top - 1u) : -1.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (lane + 32 * i == win) v[i] = -1.0f;
    }
    sel_sum = __fadd_rn(sel_sum, win_p);  // every lane, same order
    if (lane == j) {
      my_p = win_p;
      my_id = win;
    }
  }
}

// A call of one token by one warp. Its k experts are distinct, so its grouping is its selections sorted by id: lane j
// < k (selection j) gets its id, its p, the weights' denominator and `pos`, the number of its ids below j's — its
// entry, its expert's active rank and (one vector a chunk) its chunk. put_single_entry then writes the lane's entry
// of every array of r (with the lane-0 totals n_active = k, active_offset[k] = k left to the caller). Used by
// moe_imma's one-token table kernel.
template <int kPer>
__device__ __forceinline__ void route_single(const float* __restrict__ lg, int n_expert, int k, int lane, int& id,
                                             float& p, float& denom, int& pos) {
  float sel_sum = 0.0f;
  route_token<kPer>(lg, n_expert, k, lane, id, p, sel_sum);
  denom = fmaxf(sel_sum, kWeightSumMin);
  pos = 0;
  for (int j = 0; j < k; ++j) pos += __shfl_sync(kFullMask, id, j) < id ? 1 : 0;
}

__device__ __forceinline__ void put_single_entry(const MoeRouting& r, int lane, int id, float wt, int pos) {
  r.ids[lane] = id;
  r.weights[lane] = wt;
  r.entry_token[pos] = 0;
  r.entry_weight[pos] = wt;
  r.token_entry[pos] = pos;
  r.active_expert[pos] = id;
  r.active_offset[pos] = pos;
}

// The routing's shared memory: per entry (t, j) the selected id and weight, per expert its token mask and first entry.
struct RouteSmem {
  int ids[kMoeMaxTokens * kMoeMaxUsed];
  float w[kMoeMaxTokens * kMoeMaxUsed];
  unsigned mask[kMoeMaxExperts];  // bit t: token t selected the expert
  int off[kMoeMaxExperts];        // the expert's first entry
  typename cub::BlockScan<int, kThreads>::TempStorage scan;
};
static_assert(kMoeMaxTokens <= 32, "a token mask per expert is one 32-bit word");
static_assert(kThreads >= kMoeMaxTokens * kMoeMaxUsed, "phase 2 gives each entry a thread");

// The grouping as it stays in shared memory (for the rest of the block, e.g. moe_imma's table writer, which then needs
// no global round trip).
struct BlockRoute {
  const unsigned* mask;  // [n_expert] bit t: token t chose the expert
  const int* first;      // [n_expert] the expert's first entry (entries by expert, then token)
};

// Phase 1 for token t by one warp: its k selections and weights into r (global) and, with s, into s's entries.
template <int kPer>
__device__ __forceinline__ void route_one(const float* __restrict__ logits, int t, int n_expert, int k, int lane,
                                          const MoeRouting& r, RouteSmem* s) {
  int my_id = 0;
  float my_p = 0.0f;
  float sel_sum = 0.0f;
  route_token<kPer>(logits + static_cast<size_t>(t) * n_expert, n_expert, k, lane, my_id, my_p, sel_sum);
  const float denom = fmaxf(sel_sum, kWeightSumMin);
  if (lane < k) {
    const float wt = __fdiv_rn(my_p, denom);
    r.ids[t * k + lane] = my_id;
    r.weights[t * k + lane] = wt;
    if (s != nullptr) {
      s->ids[t * k + lane] = my_id;
      s->w[t * k + lane] = wt;
    }
  }
}

// Phase 2 by the whole block (kThreads threads), once s.ids / s.w hold every entry and s.mask is zero (both visible
// to the block: the caller's barrier); writes the rest of r. The caller puts a __syncthreads() between this and any
// read of r or of the returned arrays by other threads of the block.
__device__ __forceinline__ BlockRoute group_entries(RouteSmem& s, int n_tok, int n_expert, int k, const MoeRouting& r) {
  using Scan = cub::BlockScan<int, kThreads>;
  const int tid = static_cast<int>(threadIdx.x);
  // Grouping: entry i = (t, j) marks token t in its expert's mask; thread e counts expert e's tokens; one exclusive
  // scan of the counts and the active flags.
  const int n_entries = n_tok * k;
  if (tid < n_entries) atomicOr(&s.mask[s.ids[tid]], 1u << (tid / k));
  __syncthreads();
  const int e = tid;
  const int c = e < n_expert ? __popc(s.mask[e]) : 0;
  const int a = c > 0 ? 1 : 0;
  static_assert(kMoeMaxTokens * kMoeMaxUsed < (1 << 16) && kMoeMaxExperts < (1 << 16), "packed scan fields");
  int packed = 0;
  Scan(s.scan).ExclusiveSum(c | a << 16, packed);
  const int off = packed & 0xFFFF;
  const int rank = packed >> 16;
  if (e == n_expert - 1) {
    *r.n_active = rank + a;
    r.active_offset[rank + a] = off + c;
  }
  if (c > 0) {
    r.active_expert[rank] = e;
    r.active_offset[rank] = off;
  }
  if (e < n_expert) s.off[e] = off;
  __syncthreads();
  // Entry (t, j) of expert x: after the tokens below t that chose x (entries by expert, then token).
  if (tid < n_entries) {
    const int t = tid / k;
    const int x = s.ids[tid];
    const int pos = s.off[x] + __popc(s.mask[x] & ((1u << t) - 1u));
    r.entry_token[pos] = t;
    r.entry_weight[pos] = s.w[tid];
    int below = 0;  // the token's selections with a lower expert id
    for (int jj = 0; jj < k; ++jj) below += s.ids[t * k + jj] < x ? 1 : 0;
    r.token_entry[t * k + below] = pos;
  }
  return BlockRoute{s.mask, s.off};
}

// The whole routing of n_tok tokens by one block of kThreads threads (see the head of this file); r in global memory.
// Returns the grouping as it stays in shared memory; the caller puts a __syncthreads() between this and any read of r
// or of the returned arrays by other threads of the block.
template <int kPer>
__device__ __forceinline__ BlockRoute route_block(const float* __restrict__ logits, int n_tok, int n_expert, int k,
                                                  const MoeRouting& r) {
  __shared__ RouteSmem s;
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < n_expert; e += kThreads) s.mask[e] = 0u;  // ordered before phase 2 by phase 1's barrier
  for (int t = tid / 32; t < n_tok; t += kWarps) route_one<kPer>(logits, t, n_expert, k, tid % 32, r, &s);
  __syncthreads();
  return group_entries(s, n_tok, n_expert, k, r);
}

// The same routing spread over n_tok blocks of kThreads threads (block t's first warp routes token t; phase 1 of 32
// tokens in one block is 32 warps on one SM, issue-bound), the grouping by the last block to finish: each block counts
// itself in *arrivals after its entries are visible device-wide, and the block that completes the count takes every
// token's entries back from global memory (L2) and groups them, after putting *arrivals back to zero (it must be zero
// before the launch). Returns true in that one block, whose s then holds the grouping as route_block's does (*rt).
template <int kPer>
__device__ __forceinline__ bool route_spread(const float* __restrict__ logits, int n_tok, int n_expert, int k,
                                             const MoeRouting& r, unsigned* arrivals, BlockRoute* rt) {
  __shared__ RouteSmem s;
  __shared__ bool last_s;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < 32) {
    route_one<kPer>(logits, static_cast<int>(blockIdx.x), n_expert, k, tid, r, nullptr);
    // The warp's entries released with its one arrival; the completing warp acquires every other block's.
    const bool last = warp_arrive(arrivals, static_cast<unsigned>(n_tok), tid);
    if (tid == 0) last_s = last;
  }
  __syncthreads();
  if (!last_s) return false;
  __threadfence();  // the block's other warps read those entries after lane 0's acquire (through L2 below)
  if (tid == 0) *arrivals = 0u;
  for (int e = tid; e < n_expert; e += kThreads) s.mask[e] = 0u;
  for (int i = tid; i < n_tok * k; i += kThreads) {
    s.ids[i] = __ldcg(r.ids + i);
    s.w[i] = __ldcg(r.weights + i);
  }
  __syncthreads();
  *rt = group_entries(s, n_tok, n_expert, k, r);
  return true;
}

// Calls f(std::integral_constant<int, kPer>{}) with the logits a lane holds for n_expert experts (the kPer a route
// kernel is instantiated for): 8 up to 256 experts, 16 up to 512 (qwen3next), else 32 — at 64 registers (1024
// threads) the last spills a few, for E > 512 only.
template <class F>
auto with_route_per_lane(int n_expert, F&& f) {
  if (n_expert <= 8 * 32) return f(std::integral_constant<int, 8>{});
  if (n_expert <= 16 * 32) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, kMoeMaxExperts / 32>{});
}

}  // namespace kestrel::gpu::moe_route_dev
