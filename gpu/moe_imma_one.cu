// moe_imma_one (see moe_imma_one.h): the one-token MoE layer in one launch.
//
// Slots: routed entry i (i < k: the token's i-th selected expert by ascending id, the chain's entry order) and, with
// a shared expert, slot k. Scratch (f32 unless said):
//   logits [E]; routing (moe_routing_carve for one token); xprep (x prepared, imma_x_bytes(H, 1));
//   gpart [slot][rg of I][row 16][gate, up][group of H][digit pair] — each gate+up task's per-group running-sum terms
//   (imma_tile::multiply_add; row stride gstride);
//   act [slot][I] — silu(gate) · up; aprep [slot] — act prepared (imma_x_bytes(I, 1) each);
//   dpart [rg of H][row 16][slot][group of I][digit pair] — each down task's (row stride dstride); sgate [1].
// Counters (u32, at the workspace's start): x prepared, logits, blocks done; then per slot and row group of I the
// finished gate+up tasks, per slot and activation group the finished row groups, per slot the prepared activation
// groups, per output row group the finished down tasks; then a flag word per block (u64).
//
// Bits: each group's terms come from imma_tile::multiply_add as in gemv_imma_segments; a row's groups are added as
// the grouped GEMV adds them (slices of gemv_imma_grouped_groups_per_slice groups: each slice's terms from 0 in group
// order per digit pair, valued by imma_tile::pair_value as pair_sum does, then the slices in order); SwiGLU, the
// preparation, the router's logits, the routing and the combine use the chain's device functions. So out is
// bit-identical to the chain's.
//
// Progress: a warp takes tasks gw, gw + W, ... (W warps, all resident: a cooperative launch) and every task waits only
// for tasks earlier in the list (the routing, computed inside the last router task, only for the logits), so the
// earliest unfinished task can always run. A wait that outlasts ~2 s (a broken counter) traps instead of hanging the
// device.
//
// Status (H200, bench_moe "us one"; docs/benchmarks.md, "MoE: one token in one launch"): correct, 41.5 µs against the
// chain's 22.8 (38.1 before the shared-memory handovers became atomics for racecheck), so off by default
// (kMoeImmaSingleLaunch). Tried: polling counters per warp (42 µs) → per-block flag words (46) → release atomics with
// the rare tasks out of line (53.5; the atomics alone made no difference) → the routing once, by the warp whose arrival
// completes the logits, instead of per block (39.6) → gate+up tasks all before down tasks, the ids cached per block
// (38.1). Longer sleeps in the waits: 38.4 / 41.1 (the spinning warps are not what slows the others). What remains is a
// chain of ~1 µs memory round trips per link (router rows, routing, gate+up, row finish, preparation, down, combine),
// each paid in series by a warp with one or two tasks; fewer links, not cheaper ones, would pay.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/gemv_imma.h"
#include "gpu/imma_prepare.cuh"
#include "gpu/imma_tile.cuh"
#include "gpu/ld_stream.cuh"
#include "gpu/moe_combine.cuh"
#include "gpu/moe_imma_one.h"
#include "gpu/moe_route.cuh"
#include "gpu/moe_router_logits.cuh"
#include "gpu/scratch_carve.h"
#include "gpu/tiled_matrix.h"
#include "gpu/warp_arrive.cuh"

namespace kestrel::gpu {
namespace {

using imma_prep::kGroupElems;
using imma_prep::kUnitsPerSlice;
using imma_prep::XLayout;
using imma_tile::kTileRows;
using imma_tile::kUnitElems;
using imma_tile::WeightBuf;
using XSourceL2 = imma_tile::XSourceT<true>;

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kWarps = 16;         // per block (512 threads, one block per SM at <= 128 registers)
constexpr int kTaskGroups = 2;     // 256-column groups per GEMV task
constexpr int kMaxGroupsH = 16;    // H <= 4096
constexpr int kMaxDownSums = 32;   // slots · groups of I, one row's down partials
constexpr int kMaxRowsI = 2048;    // I
constexpr int kMaxExperts = 512;   // E (routing with up to 16 logits a lane)
constexpr int kFixedCounters = 3;  // x prepared, logits, blocks done
enum { kCtrX = 0, kCtrLogits = 1, kCtrDone = 2 };
// Bits of a block's flag word: what its warps may wait for.
constexpr unsigned long long kBitX = 1ull << 0, kBitRouting = 1ull << 1, kBitSgate = 1ull << 2;
__host__ __device__ constexpr unsigned long long ready_bit(int slot) { return 1ull << (3 + slot); }
static_assert(3 + kMoeMaxUsed + 1 <= 64, "a flag word holds every slot");
constexpr int kMaxBlocks = 1024;  // flag words (the grid: SMs × resident blocks)

int round4(int n) { return (n + 3) / 4 * 4; }

// A group's partial terms per row in gpart / dpart: the vector's two digit pairs (lanes t = 0, 1 of multiply_add).
constexpr int kPairTerms = 2;

// Scratch pieces, in order (null base: sizes only).
struct Scratch {
  float* logits;
  void* routing;  // moe_routing_carve for one token
  uint8_t* xprep;
  float* gpart;
  float* act;
  uint8_t* aprep;
  float* dpart;
  float* sgate;
  size_t bytes;
};

// Everything of one call, by value.
struct OneArgs {
  const float* router;
  const float* x;
  float* out;
  const uint8_t* gate;
  const uint8_t* up;
  const uint8_t* down;
  const uint8_t* gate_sh;
  const uint8_t* up_sh;
  const uint8_t* down_sh;
  const uint8_t* sh_inp;  // f32 [H]
  uint64_t gu_bytes;      // one expert's tiled gate (= up) matrix
  uint64_t dn_bytes;      // one expert's tiled down matrix
  int E, k, H, I, n_slots;
  int nGH, nGI;             // 256-column groups of H and of I
  int nUH, nUI;             // 64-column units
  int rgI, rgH;             // row groups (16 rows) of the gate/up and of the down matrices
  int n_gch, n_ich;         // tasks per row group
  size_t meta_gu, meta_dn;  // bytes from a tiled matrix's start to its scales
  int gps_gu, gps_dn;       // the chain's groups per slice
  XLayout lay_h, lay_i;
  int gstride, dstride;  // row strides of gpart, dpart (floats)
  Scratch sc;            // the scratch pieces
  MoeRouting r;          // in sc.routing
  // counters
  unsigned* ctr;
  unsigned long long* flags;  // [n_blocks] per block: kBit* and ready_bit(slot)
  int n_blocks;
  int off_rg, off_act, off_ready, off_comb, n_ctr;
  // task list starts
  int t_sgate, t_router, t_sh_gu, t_gu, t_sh_dn, t_dn, t_end;  // in this order
};

// ---- synchronisation ---------------------------------------------------------------------------------------------

// Counters count arrivals (a warp's increment after its writes); the arrival that completes one publishes it by
// setting a bit in every block's flag word, and warps wait on their own block's word (first in shared memory, where a
// block keeps what it has seen). Before: every waiting warp polled the counter itself — up to ~1100 warps on a few
// L2 lines, 42 µs a layer where the chain takes 22.7 (bench_moe, H200).
__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

constexpr long long kSpinLimitCycles = 4'000'000'000LL;  // ~2 s

// Every lane returns once `bit` is set in the block's flag word (and what was written before it was set is visible).
// Shared memory that warps hand to each other (the seen bits, the routing's ids) is read and written with atomics
// only: compute-sanitizer's racecheck orders those, not flag-and-fence handovers (it reported them as hazards).
__device__ __forceinline__ void wait_bit(unsigned long long bit, const unsigned long long* word,
                                         unsigned long long& seen) {
  if ((atomicOr(&seen, 0ull) & bit) != 0) {
    __threadfence_block();
    return;
  }
  const long long t0 = clock64();
  unsigned ns = 32;
  unsigned long long v;
  while (((v = ld_relaxed(word)) & bit) == 0) {
    __nanosleep(ns);
    ns = min(ns * 2, 256u);
    if (clock64() - t0 > kSpinLimitCycles) __trap();
  }
  fence_acq_rel_gpu();
  if ((threadIdx.x % 32) == 0) atomicOr(&seen, v);
}

// Sets `bit` in every block's flag word, after one fence (what the warp wrote or acquired is visible first).
__device__ __forceinline__ void publish(unsigned long long bit, unsigned long long* words, int n_blocks, int lane) {
  __syncwarp();
  fence_acq_rel_gpu();
  for (int b = lane; b < n_blocks; b += 32) atomicOr(words + b, bit);
}

// ---- routing -------------------------------------------------------------------------------------------------------

struct BlockState {
  unsigned long long seen;       // the flag bits this block has seen set
  int ids_state;                 // 0: the routing's ids not here, 1: a warp is loading them, 2: here
  int ids[kMoeMaxUsed];          // slot i's expert (ascending ids)
  float lg[kMaxExperts];         // the logits, for the one warp of the grid that routes
  float w[kWarps][kMoeMaxUsed];  // per warp: the slots' routing weights, for a combine
};

// Routes the token (route_token, as the chain) in the warp whose arrival completed the logits, once for the grid:
// writes the routing views (moe_route's layout for one token; slot i's expert and weight are active_expert[i] and
// entry_weight[i], by ascending id) and publishes them. Before: every block routed for itself in the first warp that
// needed it — the logits read in a rolled loop (8 dependent L2 loads), and blocks that needed the routing only in a
// second task routed at 25–31 µs of a 54 µs layer.
template <int kPer>
__device__ __noinline__ void route_once(const OneArgs& a, float* lg, int lane) {
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    if (e < a.E) lg[e] = __ldcg(a.sc.logits + e);
  }
  __syncwarp();
  float p = 0.0f, denom = 0.0f;
  int id = 0, rank = 0;
  moe_route_dev::route_single<kPer>(lg, a.E, a.k, lane, id, p, denom, rank);
  if (lane < a.k) moe_route_dev::put_single_entry(a.r, lane, id, __fdiv_rn(p, denom), rank);
  if (lane == 0) {
    *a.r.n_active = a.k;
    a.r.active_offset[a.k] = a.k;
  }
  publish(kBitRouting, a.flags, a.n_blocks, lane);
}

// ---- GEMV pieces ---------------------------------------------------------------------------------------------------

// Group grp of row group rg of a tiled matrix into registers (units past the row's end read as zeros).
template <GgmlType T>
__device__ __forceinline__ void load_group(const uint8_t* base, size_t meta_off, int n_units, int rg, int grp, int lane,
                                           WeightBuf& b) {
  const uint8_t* qs;
  const uint8_t* meta;
  imma_tile::tile_lane<T>(base, meta_off, n_units, rg, grp, lane, qs, meta);
  const int left = n_units - grp * kUnitsPerSlice;
#pragma unroll
  for (int i = 0; i < kUnitsPerSlice; ++i) {
    const bool ok = i < left;
    b.w[i] = ok ? ldg_stream(qs + i * 512) : make_uint4(0, 0, 0, 0);
    if constexpr (T == GgmlType::kQ4_0) b.m0[i] = ok ? ldg_stream2(meta + i * 64) : make_uint2(0, 0);
  }
  if constexpr (T == GgmlType::kQ4_K) {  // whole groups only (n_cols % 256 == 0)
    b.mk[0] = ldg_stream(meta);
    b.mk[1] = ldg_stream(meta + 128);
  }
}

// Where a lane finds group grp of one prepared vector xb (a pair of one vector, as gemv_imma_kernel reads it).
__device__ __forceinline__ XSourceL2 x_source(const uint8_t* xb, const XLayout& lay, int grp, int lane) {
  const int g = lane / 4, t = lane % 4;
  return XSourceL2{xb + imma_tile::x_frag_off(grp, g, t), xb + imma_tile::x_dsum_off(lay, grp, t),
                   xb + imma_tile::x_scale_off(lay, grp)};
}

// Adds a row's per-group sums as the grouped GEMV does: slices of gps groups, each from 0 in group order, then the
// slices in order (an empty slice adds +0, which changes nothing: no sum here is −0). Call add() with the groups in
// order, take() after the row's last group.
struct RowSum {
  float acc0 = 0.0f, acc1 = 0.0f, sum = 0.0f;
  bool first = true;
  // Group gi's running-sum terms of the vector's digit pairs 0 and 1 (imma_tile::multiply_add from zero).
  __device__ __forceinline__ void add(float v0, float v1, int gi, int gps, int n_groups) {
    acc0 = __fadd_rn(acc0, v0);
    acc1 = __fadd_rn(acc1, v1);
    if ((gi + 1) % gps == 0 || gi + 1 == n_groups) {
      const float slice = imma_tile::pair_value(acc0, acc1);  // imma_tile::pair_sum at the slice's end
      sum = first ? slice : __fadd_rn(sum, slice);
      first = false;
      acc0 = acc1 = 0.0f;
    }
  }
  __device__ __forceinline__ float take() {
    const float s = sum;
    acc0 = acc1 = sum = 0.0f;
    first = true;
    return s;
  }
};

// One lane's row of a partial array: its first n floats (n <= kMax; the row is padded to a multiple of 4) into v.
template <int kMax>
__device__ __forceinline__ void load_row(const float* p, int n, float (&v)[kMax]) {
#pragma unroll
  for (int q = 0; q < kMax / 4; ++q) {
    const float4 f = 4 * q < n ? __ldcg(reinterpret_cast<const float4*>(p) + q) : make_float4(0, 0, 0, 0);
    v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
  }
}

// ---- tasks ---------------------------------------------------------------------------------------------------------

template <GgmlType T, int kPer>
struct Tasks {
  const OneArgs& a;
  BlockState& br;
  int lane;

  // Slot's expert, once the routing is published: the block's first warp to ask copies the k ids into shared memory.
  __device__ __forceinline__ int expert(int slot) const {
    if (atomicAdd(&br.ids_state, 0) != 2) {
      int won = 0;
      if (lane == 0) won = atomicCAS(&br.ids_state, 0, 1) == 0 ? 1 : 0;
      if (__shfl_sync(kFull, won, 0)) {
        wait_bit(kBitRouting, a.flags + blockIdx.x, br.seen);
        if (lane < a.k) atomicExch(&br.ids[lane], __ldcg(a.r.active_expert + lane));
        __syncwarp();
        __threadfence_block();
        if (lane == 0) atomicExch(&br.ids_state, 2);
      } else {
        while (atomicAdd(&br.ids_state, 0) != 2) __nanosleep(32);
      }
    }
    __threadfence_block();
    return atomicAdd(&br.ids[slot], 0);
  }

  __device__ __forceinline__ void prepare_x(int grp) const {
    imma_prep::prepare_group(imma_prep::PlainRows{a.x}, a.H, a.lay_h, a.sc.xprep, 0, grp, lane);
    if (warp_arrive(a.ctr + kCtrX, static_cast<unsigned>(a.nGH), lane)) publish(kBitX, a.flags, a.n_blocks, lane);
  }

  __device__ __forceinline__ void shared_gate() const {
    const float s = moe_combine::shared_gate_warp<GgmlType::kF32>(a.sh_inp, a.x, a.H, lane);
    if (lane == 0) *a.sc.sgate = s;
    publish(kBitSgate, a.flags, a.n_blocks, lane);
  }

  __device__ __forceinline__ void router_row(int e) const {
    moe_router_logits::router_logits_block<false>(a.router, a.x, a.H, a.E, 1, a.sc.logits,
                                                  e / moe_router_logits::kRouterWarps,
                                                  e % moe_router_logits::kRouterWarps, nullptr);
    if (warp_arrive(a.ctr + kCtrLogits, static_cast<unsigned>(a.E), lane)) route_once<kPer>(a, br.lg, lane);
  }

  // Gate (m = 0) or up (m = 1) of slot, row group rg, groups ch·kTaskGroups.. of the row.
  __device__ __forceinline__ void gate_up(int slot, int m, int rg, int ch) const {
    const uint8_t* base;
    if (slot < a.k) {
      base = (m == 0 ? a.gate : a.up) + static_cast<uint64_t>(expert(slot)) * a.gu_bytes;
    } else {
      base = m == 0 ? a.gate_sh : a.up_sh;
    }
    const int grp0 = ch * kTaskGroups;
    WeightBuf b[kTaskGroups];
#pragma unroll
    for (int q = 0; q < kTaskGroups; ++q) {
      if (grp0 + q < a.nGH) load_group<T>(base, a.meta_gu, a.nUH, rg, grp0 + q, lane, b[q]);
    }
    wait_bit(kBitX, a.flags + blockIdx.x, br.seen);
    const int g = lane / 4, t = lane % 4;
    float* part =
        a.sc.gpart + (static_cast<size_t>(slot) * a.rgI + rg) * kTileRows * a.gstride + kPairTerms * m * a.nGH;
#pragma unroll
    for (int q = 0; q < kTaskGroups; ++q) {
      if (grp0 + q < a.nGH) {
        float sum[2] = {0.0f, 0.0f};
        imma_tile::multiply_add<T>(b[q], x_source(a.sc.xprep, a.lay_h, grp0 + q, lane), sum);
        if (t < 2) {  // the vector's two digit pairs
          part[g * a.gstride + kPairTerms * (grp0 + q) + t] = sum[0];
          part[(g + 8) * a.gstride + kPairTerms * (grp0 + q) + t] = sum[1];
        }
      }
    }
    if (warp_arrive(a.ctr + a.off_rg + slot * a.rgI + rg, static_cast<unsigned>(2 * a.n_gch), lane)) {
      finish_gate_up_rows(slot, rg);
    }
  }

  // The last gate+up task of (slot, rg): the 16 rows' gate and up sums, SwiGLU into act; the last row group of an
  // activation group prepares it; the last group marks the slot's activations ready.
  __device__ __forceinline__ void finish_gate_up_rows(int slot, int rg) const {
    if (lane < kTileRows) {
      const float* p = a.sc.gpart + ((static_cast<size_t>(slot) * a.rgI + rg) * kTileRows + lane) * a.gstride;
      float v[4 * kMaxGroupsH];
      load_row<4 * kMaxGroupsH>(p, 4 * a.nGH, v);
      RowSum rs;
      float gate = 0.0f, up = 0.0f;
#pragma unroll
      for (int i = 0; i < 2 * kMaxGroupsH; ++i) {
        if (i < 2 * a.nGH) {
          const int gi = i < a.nGH ? i : i - a.nGH;
          rs.add(v[2 * i], v[2 * i + 1], gi, a.gps_gu, a.nGH);
          if (gi + 1 == a.nGH) {
            const float s = rs.take();
            if (i < a.nGH) {
              gate = s;
            } else {
              up = s;
            }
          }
        }
      }
      a.sc.act[static_cast<size_t>(slot) * a.I + rg * kTileRows + lane] = imma_prep::swiglu(gate, up);
    }
    const int rows_per_group = kGroupElems / kTileRows;
    const int j = rg / rows_per_group;
    const int in_group = min(rows_per_group, a.rgI - j * rows_per_group);
    if (warp_arrive(a.ctr + a.off_act + slot * a.nGI + j, static_cast<unsigned>(in_group), lane)) {
      imma_prep::prepare_group(imma_prep::L2Rows{a.sc.act}, a.I, a.lay_i, a.sc.aprep, slot, j, lane);
      if (warp_arrive(a.ctr + a.off_ready + slot, static_cast<unsigned>(a.nGI), lane)) {
        publish(ready_bit(slot), a.flags, a.n_blocks, lane);
      }
    }
  }

  // Down rows of output row group rg for slot, groups ch·kTaskGroups.. of I.
  __device__ __forceinline__ void down(int slot, int rg, int ch) const {
    const uint8_t* base;
    if (slot < a.k) {
      base = a.down + static_cast<uint64_t>(expert(slot)) * a.dn_bytes;
    } else {
      base = a.down_sh;
    }
    const int grp0 = ch * kTaskGroups;
    WeightBuf b[kTaskGroups];
#pragma unroll
    for (int q = 0; q < kTaskGroups; ++q) {
      if (grp0 + q < a.nGI) load_group<T>(base, a.meta_dn, a.nUI, rg, grp0 + q, lane, b[q]);
    }
    wait_bit(ready_bit(slot), a.flags + blockIdx.x, br.seen);
    const uint8_t* xb = a.sc.aprep + static_cast<size_t>(slot) * a.lay_i.vec_bytes();
    const int g = lane / 4, t = lane % 4;
    float* part = a.sc.dpart + static_cast<size_t>(rg) * kTileRows * a.dstride + kPairTerms * slot * a.nGI;
#pragma unroll
    for (int q = 0; q < kTaskGroups; ++q) {
      if (grp0 + q < a.nGI) {
        float sum[2] = {0.0f, 0.0f};
        imma_tile::multiply_add<T>(b[q], x_source(xb, a.lay_i, grp0 + q, lane), sum);
        if (t < 2) {
          part[g * a.dstride + kPairTerms * (grp0 + q) + t] = sum[0];
          part[(g + 8) * a.dstride + kPairTerms * (grp0 + q) + t] = sum[1];
        }
      }
    }
    if (warp_arrive(a.ctr + a.off_comb + rg, static_cast<unsigned>(a.n_slots * a.n_ich), lane)) combine(rg);
  }

  // The last down task of output row group rg: each slot's row sums, then out = Σ by ascending expert id of y·w, then
  // + sigmoid(shared gate)·shared y (moe_combine's order).
  __device__ __forceinline__ void combine(int rg) const {
    wait_bit(kBitRouting, a.flags + blockIdx.x, br.seen);
    float* w = br.w[threadIdx.x / 32];
    if (lane < a.k) w[lane] = __ldcg(a.r.entry_weight + lane);
    __syncwarp();
    float sg = 0.0f;
    if (a.n_slots > a.k) {
      wait_bit(kBitSgate, a.flags + blockIdx.x, br.seen);
      sg = __ldcg(a.sc.sgate);
    }
    if (lane < kTileRows) {  // all lanes stay on one path: the next task's warp-wide steps need them
      const float* p = a.sc.dpart + (static_cast<size_t>(rg) * kTileRows + lane) * a.dstride;
      float v[2 * kMaxDownSums];
      const int n = a.n_slots * a.nGI;
      load_row<2 * kMaxDownSums>(p, 2 * n, v);
      RowSum rs;
      float y = 0.0f;
      int slot = 0, gi = 0;
#pragma unroll
      for (int i = 0; i < kMaxDownSums; ++i) {
        if (i < n) {
          rs.add(v[2 * i], v[2 * i + 1], gi, a.gps_dn, a.nGI);
          if (++gi == a.nGI) {
            const float ye = rs.take();
            y = slot < a.k ? __fadd_rn(y, __fmul_rn(ye, w[slot])) : __fadd_rn(y, __fmul_rn(sg, ye));
            ++slot;
            gi = 0;
          }
        }
      }
      a.out[rg * kTileRows + lane] = y;
    }
  }

  // One call site per task kind (with each kind inlined at several sites the kernel's text was 368 KB; ~165 KB now).
  __device__ __forceinline__ void run(int task) const {
    if (task < a.t_sgate) return prepare_x(task);
    if (task < a.t_router) return shared_gate();
    if (task < a.t_sh_gu) return router_row(task - a.t_router);
    int slot, rg, ch;
    if (task < a.t_sh_dn) {
      // gate+up: the shared expert's (rg, m, ch), then the routed experts' (slot, rg, m, ch)
      const bool shared = task < a.t_gu;
      const int per_slot = 2 * a.rgI * a.n_gch;
      const int i = shared ? task - a.t_sh_gu : task - a.t_gu;
      const int r = i % per_slot;
      slot = shared ? a.k : i / per_slot;
      rg = r / (2 * a.n_gch);
      ch = r % a.n_gch;
      return gate_up(slot, r / a.n_gch % 2, rg, ch);
    }
    // down: the shared expert's (rg, ch), then the routed experts' (rg, slot, ch)
    if (task < a.t_dn) {
      const int i = task - a.t_sh_dn;
      slot = a.k;
      rg = i / a.n_ich;
      ch = i % a.n_ich;
    } else {
      const int i = task - a.t_dn;
      slot = i / a.n_ich % a.k;
      rg = i / (a.n_ich * a.k);
      ch = i % a.n_ich;
    }
    return down(slot, rg, ch);
  }
};

template <GgmlType T, int kPer>
__global__ void __launch_bounds__(kWarps * 32, 1) moe_one_kernel(const __grid_constant__ OneArgs a) {
  __shared__ BlockState br;
  if (threadIdx.x == 0) {
    br.seen = 0ull;
    br.ids_state = 0;
  }
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int n_warps = static_cast<int>(gridDim.x) * kWarps;
  const int gw = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  const Tasks<T, kPer> tasks{a, br, lane};
  for (int task = gw; task < a.t_end; task += n_warps) tasks.run(task);
  // The last block to finish puts the counters and flags back to zero for the next call (every other block is past
  // its waits).
  __syncthreads();
  if (threadIdx.x < 32 && warp_arrive(a.ctr + kCtrDone, gridDim.x, lane)) {
    for (int i = lane; i < a.n_ctr; i += 32) a.ctr[i] = 0u;
    for (int b = lane; b < a.n_blocks; b += 32) a.flags[b] = 0ull;
  }
}

// ---- host ---------------------------------------------------------------------------------------------------------

struct Shape {
  int E, k, H, I, n_slots, nGH, nGI, rgI, rgH;
  // Row strides (floats) of gpart (gate and up, each group's terms) and dpart (every slot's groups' terms).
  int gstride() const { return round4(2 * kPairTerms * nGH); }
  int dstride() const { return round4(kPairTerms * n_slots * nGI); }
};

Shape shape_of(const MoeImmaWeights& w) {
  Shape s;
  s.E = static_cast<int>(w.n_expert);
  s.k = w.n_expert_used;
  s.H = static_cast<int>(w.n_embd);
  s.I = static_cast<int>(w.n_ff);
  s.n_slots = s.k + (w.has_shared_expert() ? 1 : 0);
  s.nGH = (s.H + kGroupElems - 1) / kGroupElems;
  s.nGI = (s.I + kGroupElems - 1) / kGroupElems;
  s.rgI = s.I / kTileRows;
  s.rgH = s.H / kTileRows;
  return s;
}

int counters_of(const Shape& s) { return kFixedCounters + s.n_slots * s.rgI + s.n_slots * s.nGI + s.n_slots + s.rgH; }

// Counter words, then kMaxBlocks flag words (8-aligned).
size_t flags_offset(const Shape& s) { return align16(static_cast<size_t>(counters_of(s)) * 4); }

Scratch scratch_of(const MoeImmaWeights& w, const Shape& s, void* base) {
  ScratchCarve sc(base);
  Scratch c;
  c.logits = sc.take<float>(static_cast<size_t>(s.E) * 4);
  c.routing = sc.take(moe_routing_bytes(1, s.E, s.k));
  c.xprep = sc.take(imma_x_bytes(w.n_embd, 1));
  c.gpart = sc.take<float>(static_cast<size_t>(s.n_slots) * s.rgI * kTileRows * static_cast<size_t>(s.gstride()) * 4);
  c.act = sc.take<float>(static_cast<size_t>(s.n_slots) * s.I * 4);
  c.aprep = sc.take(static_cast<size_t>(s.n_slots) * imma_x_bytes(w.n_ff, 1));
  c.dpart = sc.take<float>(static_cast<size_t>(s.rgH) * kTileRows * static_cast<size_t>(s.dstride()) * 4);
  c.sgate = sc.take<float>(4);
  c.bytes = sc.bytes();
  return c;
}

template <GgmlType T, int kPer>
Status launch(const OneArgs& args, cudaStream_t stream) {
  static std::atomic<int> grid{0};  // SMs × resident blocks (a benign race: the same value)
  if (grid.load(std::memory_order_relaxed) == 0) {
    int dev = 0, sms = 0, per_sm = 0;
    KESTREL_CUDA_TRY(cudaGetDevice(&dev));
    KESTREL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KESTREL_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_one_kernel<T, kPer>, kWarps * 32, 0));
    if (per_sm < 1) return make_error(ErrorCode::kInternal, "moe_imma_one: the kernel does not fit an SM");
    if (sms * per_sm > kMaxBlocks) return make_error(ErrorCode::kInternal, "moe_imma_one: more blocks than flag words");
    grid.store(sms * per_sm, std::memory_order_relaxed);
  }
  OneArgs a = args;
  a.n_blocks = grid.load(std::memory_order_relaxed);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(a.n_blocks));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;  // every block resident at once, or the launch fails
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  KESTREL_CUDA_TRY(cudaLaunchKernelEx(&cfg, moe_one_kernel<T, kPer>, a));
  return ok_status();
}

}  // namespace

bool moe_imma_one_supports(const MoeImmaWeights& w) {
  const Shape s = shape_of(w);
  const bool f32_router =
      w.router.type == GgmlType::kF32 && s.H % 4 == 0 && reinterpret_cast<uintptr_t>(w.router.data) % 16 == 0;
  const bool f32_gate = !w.has_shared_expert() || w.shared_gate_inp.type == GgmlType::kF32;
  // Its tasks multiply every matrix with one Q4 type's tile code.
  const bool one_q4 =
      w.gate_up_type == w.down_type && (w.gate_up_type == GgmlType::kQ4_0 || w.gate_up_type == GgmlType::kQ4_K);
  return f32_router && f32_gate && one_q4 && s.E <= kMaxExperts && s.nGH <= kMaxGroupsH && s.I <= kMaxRowsI &&
         s.n_slots * s.nGI <= kMaxDownSums;
}

size_t moe_imma_one_counter_bytes(const MoeImmaWeights& w) {
  return flags_offset(shape_of(w)) + kMaxBlocks * sizeof(unsigned long long);
}

size_t moe_imma_one_scratch_bytes(const MoeImmaWeights& w) { return scratch_of(w, shape_of(w), nullptr).bytes; }

Status moe_imma_one_forward(const MoeImmaWeights& w, const float* x, float* out, void* counters, void* scratch,
                            cudaStream_t stream, MoeRouting* routing) {
  const Shape s = shape_of(w);
  const Scratch c = scratch_of(w, s, scratch);
  OneArgs a{};
  a.router = static_cast<const float*>(w.router.data);
  a.x = x;
  a.out = out;
  a.gate = static_cast<const uint8_t*>(w.gate_exps);
  a.up = static_cast<const uint8_t*>(w.up_exps);
  a.down = static_cast<const uint8_t*>(w.down_exps);
  a.gate_sh = static_cast<const uint8_t*>(w.gate_shexp);
  a.up_sh = static_cast<const uint8_t*>(w.up_shexp);
  a.down_sh = static_cast<const uint8_t*>(w.down_shexp);
  a.sh_inp = static_cast<const uint8_t*>(w.shared_gate_inp.data);
  a.gu_bytes = tiled_bytes(w.gate_up_type, w.n_embd, w.n_ff);
  a.dn_bytes = tiled_bytes(w.down_type, w.n_ff, w.n_embd);
  a.E = s.E;
  a.k = s.k;
  a.H = s.H;
  a.I = s.I;
  a.n_slots = s.n_slots;
  a.nGH = s.nGH;
  a.nGI = s.nGI;
  a.nUH = s.H / kUnitElems;
  a.nUI = s.I / kUnitElems;
  a.rgI = s.rgI;
  a.rgH = s.rgH;
  a.n_gch = (s.nGH + kTaskGroups - 1) / kTaskGroups;
  a.n_ich = (s.nGI + kTaskGroups - 1) / kTaskGroups;
  a.meta_gu = static_cast<size_t>(s.rgI) * a.nUH * 512;
  a.meta_dn = static_cast<size_t>(s.rgH) * a.nUI * 512;
  a.gps_gu = gemv_imma_grouped_groups_per_slice(s.H);
  a.gps_dn = gemv_imma_grouped_groups_per_slice(s.I);
  a.lay_h = imma_prep::x_layout(s.H);
  a.lay_i = imma_prep::x_layout(s.I);
  a.gstride = s.gstride();
  a.dstride = s.dstride();
  a.sc = c;
  a.r = moe_routing_carve(c.routing, 1, s.E, s.k);
  a.ctr = static_cast<unsigned*>(counters);
  a.off_rg = kFixedCounters;
  a.off_act = a.off_rg + s.n_slots * s.rgI;
  a.off_ready = a.off_act + s.n_slots * s.nGI;
  a.off_comb = a.off_ready + s.n_slots;
  a.n_ctr = counters_of(s);
  a.flags = reinterpret_cast<unsigned long long*>(static_cast<unsigned char*>(counters) + flags_offset(s));
  const bool shared = w.has_shared_expert();
  a.t_sgate = s.nGH;
  a.t_router = a.t_sgate + (shared ? 1 : 0);
  a.t_sh_gu = a.t_router + s.E;
  // Every gate+up task before any down task: a down task waits for its activations, and one in a warp's first round
  // (the shared expert's came right after its gate+up) held that warp until ~20 µs, so its second task — gate+up — was
  // the layer's last.
  a.t_gu = a.t_sh_gu + (shared ? 2 * s.rgI * a.n_gch : 0);
  a.t_sh_dn = a.t_gu + s.k * 2 * s.rgI * a.n_gch;
  a.t_dn = a.t_sh_dn + (shared ? s.rgH * a.n_ich : 0);
  a.t_end = a.t_dn + s.k * s.rgH * a.n_ich;
  if (routing != nullptr) *routing = a.r;
  const bool q40 = w.gate_up_type == GgmlType::kQ4_0;
  if (s.E <= 8 * 32) return q40 ? launch<GgmlType::kQ4_0, 8>(a, stream) : launch<GgmlType::kQ4_K, 8>(a, stream);
  return q40 ? launch<GgmlType::kQ4_0, 16>(a, stream) : launch<GgmlType::kQ4_K, 16>(a, stream);
}

}  // namespace kestrel::gpu
