// gdn_decode (see gdn_decode.h): the per-V-head kernel (gdn_head_kernel, described above its code) wherever dk, dv
// <= 128 — every preset — and the two-kernel path for larger heads:
//   step   grid (⌈dv/32⌉, Vh, n_seq), 256 threads = 8 warps: block (cb, h, n) owns columns j = 32·cb + lane of V-head h
//          of session n; warp w holds rows [w·R, w·R + R) of S_h in registers (R = ⌈dk/8⌉ rounded up to 4/8/16/32, a
//          template), so S is read once (a warp reads 128 contiguous bytes of a row, loads issued first) and written
//          once. Prologue: conv + SiLU of the K-head's q and k channels (history only read), of the block's 32 v
//          channels (history shifted: only this block reads them) and the gates of h; q/k L2 norms by warps 0 and 1;
//          then decay, m = Sᵀk̂, δ = (v − m)·beta, S += k̂δᵀ, o = Sᵀq̂, o written to out.
//   norm   grid (Vh, n_seq), one warp: the gated RMSNorm of o_h, in place in out; the block of the first V-head of each
//          K-head shifts the q/k history (stream order: every reader is done).
// Element-wise arithmetic that the reference does without FMA (conv taps, delta-rule products, norms) uses
// __fmul_rn/__fadd_rn so nvcc cannot contract it; differences from the reference are summation order and the
// device's expf/log1pf (≤ 2 ulp), which is what the test tolerance covers. The exception is the per-V-head kernel's
// delta rule (the presets' kernel), which fuses its products into __fmaf_rn and applies the decay to m once per
// column: one rounding less per element, fewer instructions (see gdn_head_kernel).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gdn_common.cuh"
#include "gpu/kernels/gdn_decode.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/pdl.cuh"

namespace kestrel::gpu {
namespace {

using namespace gdn_detail;  // NOLINT(google-build-using-namespace): the kernels' shared helpers

constexpr int kDeltaWarps = 8;
constexpr int kDeltaThreads = 32 * kDeltaWarps;

// A warp's slice of S_h: column j of rows [i0, i0 + R), one row per register; p points at row i0, and `rows` of the R
// rows exist (0 for a column past dv, fewer than R past dk). Row r is at p + r·dv from the one base pointer: the
// per-row 64-bit index arithmetic, each row predicated on its own, took ~12 instructions a row before the first
// load could issue (~300 of a warp's ~620 prologue instructions, ncu SASS counts at the 35B-A3B shape).
__device__ __forceinline__ int slice_rows(const Geo& g, int i0, int R, bool col_ok) {
  return col_ok ? max(0, min(R, g.d_k - i0)) : 0;
}

template <int R>
__device__ __forceinline__ void load_s_slice(const float* p, size_t dv, int rows, float (&s)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = r < rows ? __ldcs(p + r * dv) : 0.0f;
}

template <int R>
__device__ __forceinline__ void store_s_slice(float* p, size_t dv, int rows, const float (&s)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r < rows) __stcs(p + r * dv, s[r]);
  }
}

// The block's own v channels (column j of V-head h: conv + SiLU into vs, history shifted; only this block reads
// them) by the last warp, and the head's gates beta = sigmoid(b), decay = exp(ssm_a·softplus(a + dt_bias)) by one
// thread of the warp before it (the step kernel's prologue).
__device__ __forceinline__ void v_channels_and_gates(const Geo& g, const GdnDecodeWeights& w, const GdnDecodeInputs& in,
                                                     const GdnSlot& slot, const float* row, int n, int h, int j,
                                                     bool col_ok, int tid, float* vs, float* gates) {
  const int warp = tid / 32;
  const int lane = tid % 32;
  if (warp == kDeltaWarps - 1) {
    if (col_ok) {
      const int c = 2 * g.key_dim + h * g.d_v + j;
      const float x = row[qkv_index(g, c)];
      vs[lane] = conv_channel(g, w.conv1d, slot.conv, x, c);
      shift_history(g, slot.conv, x, c);
    } else {
      vs[lane] = 0.0f;
    }
  }
  if (tid == 32 * (kDeltaWarps - 2)) head_gates(g, w, in, n, h, gates);
}

template <int R>
__global__ void __launch_bounds__(kDeltaThreads)
    gdn_step_kernel(Geo g, GdnDecodeWeights w, GdnDecodeInputs in, const GdnSlot* __restrict__ slots,
                    float* __restrict__ o_out) {
  __shared__ float qs[kDeltaWarps * R];  // conv output of q_kh, then q̂ (zeros past dk)
  __shared__ float ks[kDeltaWarps * R];  // conv output of k_kh, then k̂
  __shared__ float red[kDeltaWarps][32];
  __shared__ float vs[32];
  __shared__ float inv_norm[2];
  __shared__ float gates[2];  // beta, decay
  const int h = static_cast<int>(blockIdx.y);
  const int n = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int kh = k_head_of(g, h);
  const GdnSlot slot = slots[n];
  const int j = static_cast<int>(blockIdx.x) * 32 + lane;
  const bool col_ok = j < g.d_v;
  float* sh = slot.s + static_cast<size_t>(h) * g.d_k * g.d_v;
  const int i0 = warp * R;

  // S slice: loads first, so they are in flight during the prologue.
  const size_t dv = static_cast<size_t>(g.d_v);
  const int rows = slice_rows(g, i0, R, col_ok);
  float* s_slice = sh + static_cast<size_t>(i0) * dv + j;
  float s[R];
  load_s_slice(s_slice, dv, rows, s);

  // Prologue: q/k conv of kh (history read only), v conv of this block's columns (history shifted), gates of h.
  const float* row = in.qkv + static_cast<size_t>(n) * g.qkv_stride;
  for (int t = tid; t < kDeltaWarps * R; t += kDeltaThreads) {
    float uq = 0.0f;
    float uk = 0.0f;
    if (t < g.d_k) {
      const int cq = kh * g.d_k + t;
      const int ck = g.key_dim + kh * g.d_k + t;
      uq = conv_channel(g, w.conv1d, slot.conv, row[qkv_index(g, cq)], cq);
      uk = conv_channel(g, w.conv1d, slot.conv, row[qkv_index(g, ck)], ck);
    }
    qs[t] = uq;
    ks[t] = uk;
  }
  v_channels_and_gates(g, w, in, slot, row, n, h, j, col_ok, tid, vs, gates);
  __syncthreads();
  if (warp < 2) {
    const float ss = warp_sum_squares(warp == 0 ? qs : ks, g.d_k, lane);
    if (lane == 0) inv_norm[warp] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, 1e-6f)));
  }
  __syncthreads();
  for (int t = tid; t < g.d_k; t += kDeltaThreads) {
    qs[t] = __fmul_rn(__fmul_rn(qs[t], inv_norm[0]), g.q_scale);
    ks[t] = __fmul_rn(ks[t], inv_norm[1]);
  }
  __syncthreads();

  const float beta = gates[0];
  const float decay = gates[1];
  float m = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = __fmul_rn(s[r], decay);
    m = __fadd_rn(m, __fmul_rn(s[r], ks[i0 + r]));
  }
  red[warp][lane] = m;
  __syncthreads();
  m = 0.0f;
#pragma unroll
  for (int w8 = 0; w8 < kDeltaWarps; ++w8) m = __fadd_rn(m, red[w8][lane]);
  const float delta = __fmul_rn(__fsub_rn(vs[lane], m), beta);
  __syncthreads();  // everyone has read red

  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = __fadd_rn(s[r], __fmul_rn(ks[i0 + r], delta));
    o = __fadd_rn(o, __fmul_rn(s[r], qs[i0 + r]));
  }
  store_s_slice(s_slice, dv, rows, s);
  red[warp][lane] = o;
  __syncthreads();
  if (warp == 0 && col_ok) {
    o = 0.0f;
#pragma unroll
    for (int w8 = 0; w8 < kDeltaWarps; ++w8) o = __fadd_rn(o, red[w8][lane]);
    o_out[static_cast<size_t>(n) * g.value_dim + static_cast<size_t>(h) * g.d_v + j] = o;
  }
}

// In place: reads o_h from out and overwrites it with the gated norm (each lane reads all of o_h for the sum of
// squares, then rewrites only the elements it reads again).
__global__ void __launch_bounds__(32) gdn_norm_kernel(Geo g, const float* __restrict__ ssm_norm, GdnDecodeInputs in,
                                                      const GdnSlot* __restrict__ slots, float* out) {
  const int h = static_cast<int>(blockIdx.x);
  const int n = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x);
  const size_t off = static_cast<size_t>(n) * g.value_dim + static_cast<size_t>(h) * g.d_v;
  const float* o = out + off;
  const float ss = warp_sum_squares(o, g.d_v, lane);
  const float mean = __fdiv_rn(ss, static_cast<float>(g.d_v));
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, g.eps)));
  const float* z;
  if (g.proj == 2) {  // z_h of the legacy qkvz row (a head's dv values are contiguous there)
    z = in.qkv + static_cast<size_t>(n) * g.qkv_stride + z_index(g, h, 0);
  } else {
    z = in.z + static_cast<size_t>(n) * g.z_stride + static_cast<size_t>(h) * g.d_v;
  }
  for (int e = lane; e < g.d_v; e += 32) {
    out[off + e] = __fmul_rn(__fmul_rn(__fmul_rn(o[e], scale), ssm_norm[e]), silu_rn(z[e]));
  }
  // The q/k history of K-head kh, shifted once every step kernel that read it has finished.
  const bool first_of_k_head = g.tiled ? h < g.n_k_heads : h % g.r == 0;
  if (first_of_k_head) {
    const int kh = k_head_of(g, h);
    const GdnSlot slot = slots[n];
    const float* row = in.qkv + static_cast<size_t>(n) * g.qkv_stride;
    for (int t = lane; t < 2 * g.d_k; t += 32) {
      const int c = t < g.d_k ? kh * g.d_k + t : g.key_dim + kh * g.d_k + (t - g.d_k);
      shift_history(g, slot.conv, row[qkv_index(g, c)], c);
    }
  }
}

template <int R>
void launch_step(const Geo& g, const GdnDecodeWeights& w, const GdnDecodeInputs& in, const GdnSlot* slots, float* o,
                 int n_seq, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((g.d_v + 31) / 32), static_cast<unsigned>(g.n_v_heads),
                  static_cast<unsigned>(n_seq));
  gdn_step_kernel<R><<<grid, kDeltaThreads, 0, stream>>>(g, w, in, slots, o);
}

// The per-V-head step: grid (Vh, n_seq), 512 threads = 16 warps, one block per (session, V-head) holding all of S_h
// in registers — warp w rows [8w, 8w + 8), lane columns lane + 32c (c < 4), so dk, dv <= 128 — and the gated norm
// inside the block: no second kernel. The prologue runs one channel per thread at once: threads 0–127 q of kh,
// 128–255 k of kh (history read only; every V-head block of kh computes the same values bit for bit), 256–383 the v
// channels of h (history shifted by the same thread), 384–511 z and ssm_norm of a column, thread 384 also the gates.
// The q/k history of kh is read by the r blocks of its V-heads, so the last of them to finish reading (a counter per
// (session, K-head) in the workspace, zero between calls) shifts it. Five __syncthreads.
// Programmatic forms (kPdl): the slot pointer and S (and, up to kGdnTapsAheadMaxSessions sessions, the conv taps and
// history: kTapsAhead) are loaded before the wait; the reader count's result is read only before barrier 5, so thread
// 0's warp does not stall on the atomic in front of its rows of m. Plain launches read it at once: there the late read
// costs registers and measured slower.
// Summation orders: L2 sums per warp then in warp order, column sums per warp (8 rows) then the 16 warp partials in
// order, Σo² per warp of 32 columns then in warp order.
// The delta rule in FMAs: m_j = decay · Σ_i S_ij·k̂_i (__fmaf_rn down the warp's rows from the S of the last step, the
// warp partials added in order, then one multiply), S_ij ← fma(k̂_i, δ_j, S_ij·decay), o_j = Σ_i fma(S_ij, q̂_i): 4
// instructions an element where the reference's separate products and sums take 7. At one block an SM (4 warps a
// scheduler) the m and o phases are issue-bound, so this is what makes them faster (chained steps 0.2–1.4 µs faster
// from 2 sessions, bench_gdn, H200); the errors stay inside test_gdn_decode's tolerance.
// kFull: dk = dv = 128 compiled in (every full-size preset): no per-row or per-column predicates, immediate offsets.
// `__launch_bounds__(512, 2)` caps it at 64 registers (two blocks an SM: 16% faster than one from 8 sessions on,
// 0.3 µs slower at 1-4); there the generic form spills 56-60 bytes and the full one none (its conv channel is found
// once, up front: ch). At one session, where nothing hides latency, that was 9.7 against 6.9 µs (6.6 without the
// full form's last spills).

// Where the per-V-head kernel also writes its output's prepared form (gdn_decode's out_prepared): the 256-column
// groups of a session's output row span several V-heads' blocks, so each group has a counter (groups, zero between
// calls) and the block that finishes a group last prepares it.
struct OutPrep {
  uint8_t* xprep = nullptr;    // null: no prepared form
  unsigned* groups = nullptr;  // [n_seq][lay.n_groups]
  imma_prep::XLayout lay;
};

// After the block's writes of V-head h's columns of out (session n): each block arrives at the counters of the groups
// its columns fall in (the arrival releases its writes: barrier, then a device fence and the increment by one thread,
// as a grid barrier does), and the last arriver at a group — its count is the heads the group's columns cover — resets
// the counter and prepares the group with one warp, reading the row through L2 after an acquiring fence. (Inlined, the
// full forms still spill nothing; out of line, the call's frame cost them spills.)
__device__ __forceinline__ void prepare_finished_groups(const Geo& g, const OutPrep& prep, const float* out, int n,
                                                        int h) {
  __shared__ bool finished[2];  // a head of dv <= 128 columns falls in at most two groups
  const int tid = static_cast<int>(threadIdx.x);
  const int c0 = h * g.d_v;
  const int first = c0 / imma_prep::kGroupElems;
  const int last = (c0 + g.d_v - 1) / imma_prep::kGroupElems;
  __syncthreads();  // the block's columns of out are written
  if (tid == 0) {
    __threadfence();
    for (int grp = first; grp <= last; ++grp) {
      const int g_end = min((grp + 1) * imma_prep::kGroupElems, g.value_dim);
      const unsigned heads = static_cast<unsigned>((g_end - 1) / g.d_v - grp * imma_prep::kGroupElems / g.d_v + 1);
      unsigned* counter = prep.groups + static_cast<size_t>(n) * prep.lay.n_groups + grp;
      const bool done = atomicAdd(counter, 1u) + 1u == heads;
      if (done) *counter = 0u;  // every head of the group has arrived: ready for the next call
      finished[grp - first] = done;
    }
    __threadfence();
  }
  __syncthreads();
  const int warp = tid / 32;
  if (warp <= last - first && finished[warp]) {
    imma_prep::prepare_group(imma_prep::L2Rows{out}, g.value_dim, prep.lay, prep.xprep, n, first + warp, tid % 32);
  }
}

// Programmatic launches of up to this many sessions load the conv taps and history before the wait: at 1-2 sessions
// that takes a memory round trip off the step, but above 4 the registers held across the wait (36-40 bytes of
// spills) cost more than it saves.
constexpr int kGdnTapsAheadMaxSessions = 4;

template <bool kPdl, bool kFull, bool kTapsAhead>
__global__ void __launch_bounds__(kHeadThreads, 2)
    gdn_head_kernel(Geo g, GdnDecodeWeights w, GdnDecodeInputs in, const GdnSlot* __restrict__ slots,
                    unsigned* __restrict__ readers, float* __restrict__ out, OutPrep prep) {
  __shared__ float qs[kHeadMaxD];  // conv output of q_kh, k_kh (zeros past dk)
  __shared__ float ks[kHeadMaxD];
  __shared__ float vs[kHeadMaxD];     // conv output of v_h (zeros past dv)
  __shared__ float zs[kHeadMaxD];     // silu(z) of h
  __shared__ float nrm[kHeadMaxD];    // ssm_norm
  __shared__ float delta[kHeadMaxD];  // (v − Sᵀk̂)·beta
  __shared__ float red[kHeadWarps][kHeadMaxD];
  __shared__ float sq_part[2][kHeadWarps];
  __shared__ float gates[2];  // beta, decay
  __shared__ bool last_reader;
  if constexpr (kPdl) pdl_trigger();
  const int h = static_cast<int>(blockIdx.x);
  const int n = static_cast<int>(blockIdx.y);
  const int kh = k_head_of(g, h);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const GdnSlot slot = slots[n];
  const int i0 = warp * kHeadRows;
  const size_t dv = kFull ? kHeadMaxD : static_cast<size_t>(g.d_v);
  const int rows = kFull ? kHeadRows : max(0, min(kHeadRows, g.d_k - i0));
  float* s_slice = slot.s + (static_cast<size_t>(h) * (kFull ? kHeadMaxD : g.d_k) + i0) * dv + lane;
  float s[kHeadRows][kHeadCols];
#pragma unroll
  for (int r = 0; r < kHeadRows; ++r) {
#pragma unroll
    for (int c = 0; c < kHeadCols; ++c) {
      s[r][c] = kFull || (r < rows && lane + 32 * c < g.d_v) ? __ldcs(s_slice + r * dv + 32 * c) : 0.0f;
    }
  }
  const int part = tid / kHeadMaxD;  // 0 q, 1 k, 2 v, 3 z/norm
  const int e = tid % kHeadMaxD;
  // This thread's conv channel (part 0–2), and under a programmatic launch its taps and history loaded before the
  // wait with the S slice (resident weights; the history is the layer's own state, as S), so that after the wait
  // only x is a memory round trip away.
  int ch = -1;
  if (part < 2 && e < g.d_k) ch = (part == 1 ? g.key_dim : 0) + kh * g.d_k + e;
  if (part == 2 && e < g.d_v) ch = 2 * g.key_dim + h * g.d_v + e;
  static_assert(kPdl || !kTapsAhead, "taps ahead of the wait only under a programmatic launch");
  ConvTaps taps;
  const bool taps_ahead = kTapsAhead && g.kernel <= kConvTapsAhead;
  if (taps_ahead && ch >= 0) taps.load(g, w.conv1d, slot.conv, ch);
  if constexpr (kPdl) pdl_wait();

  // Prologue, one channel per thread.
  const float* row = in.qkv + static_cast<size_t>(n) * g.qkv_stride;
  float x_qk = 0.0f;  // raw input of this thread's q/k channel (for the history shift)
  float sq = 0.0f;
  if (part < 2) {
    float u = 0.0f;
    if (ch >= 0) {
      x_qk = row[qkv_index(g, ch)];
      u = taps_ahead ? taps.conv(g, x_qk) : conv_channel(g, w.conv1d, slot.conv, x_qk, ch);
    }
    (part == 0 ? qs : ks)[e] = u;
    sq = __fmul_rn(u, u);
  } else if (part == 2) {
    float u = 0.0f;
    if (ch >= 0) {
      const float x = row[qkv_index(g, ch)];
      u = taps_ahead ? taps.conv(g, x) : conv_channel(g, w.conv1d, slot.conv, x, ch);
      shift_history(g, slot.conv, x, ch);
    }
    vs[e] = u;
  } else if (part == 3) {
    if (e < g.d_v) {
      nrm[e] = w.ssm_norm[e];
      zs[e] = silu_rn(g.proj == 2 ? row[z_index(g, h, e)]
                                  : in.z[static_cast<size_t>(n) * g.z_stride + static_cast<size_t>(h) * g.d_v + e]);
    }
    if (e == 0) {
      head_gates(g, w, in, n, h, gates);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sq = __fadd_rn(sq, __shfl_xor_sync(kFullMask, sq, off));
  if (lane == 0 && part < 2) sq_part[part][warp % (kHeadMaxD / 32)] = sq;
  __syncthreads();  // 1: prologue done; every q/k history read of this block has completed
  // The count of the K-head's readers. kPdl: thread 0 counts the block now and looks at the count only before barrier
  // 5 (a warp stalls on an atomic's result only where it uses it); plain launches look at once (measured faster
  // there, their kernel keeping one spill-free form).
  unsigned* counter = readers + static_cast<size_t>(n) * g.n_k_heads + kh;
  unsigned readers_before = 0u;
  if constexpr (kPdl) {
    if (tid == 0) {
      __threadfence();
      readers_before = atomicAdd(counter, 1u);
    }
  } else if (tid == 0) {
    __threadfence();
    // (`counter` again, computed here: through the shared variable ptxas schedules the plain kernel differently, 39
    // more instructions.)
    unsigned* own = readers + static_cast<size_t>(n) * g.n_k_heads + kh;
    last_reader = atomicAdd(own, 1u) == static_cast<unsigned>(g.r - 1);
    if (last_reader) *own = 0u;  // every reader has counted: ready for the next call
  }

  float inv_q;
  float inv_k;
  inv_l2<kHeadMaxD / 32>(sq_part[0], sq_part[1], inv_q, inv_k);
  const float beta = gates[0];
  const float decay = gates[1];
  float m[kHeadCols] = {};
#pragma unroll
  for (int r = 0; r < kHeadRows; ++r) {
    const float kr = __fmul_rn(ks[i0 + r], inv_k);
#pragma unroll
    for (int c = 0; c < kHeadCols; ++c) m[c] = __fmaf_rn(s[r][c], kr, m[c]);
  }
#pragma unroll
  for (int c = 0; c < kHeadCols; ++c) red[warp][lane + 32 * c] = m[c];
  __syncthreads();  // 2
  if (tid < kHeadMaxD) {
    float mj = 0.0f;
#pragma unroll
    for (int w16 = 0; w16 < kHeadWarps; ++w16) mj = __fadd_rn(mj, red[w16][tid]);
    delta[tid] = __fmul_rn(__fsub_rn(vs[tid], __fmul_rn(mj, decay)), beta);
  }
  __syncthreads();  // 3

  float o[kHeadCols] = {};
#pragma unroll
  for (int r = 0; r < kHeadRows; ++r) {
    const float kr = __fmul_rn(ks[i0 + r], inv_k);
    const float qr = __fmul_rn(__fmul_rn(qs[i0 + r], inv_q), g.q_scale);
#pragma unroll
    for (int c = 0; c < kHeadCols; ++c) {
      s[r][c] = __fmaf_rn(kr, delta[lane + 32 * c], __fmul_rn(s[r][c], decay));
      o[c] = __fmaf_rn(s[r][c], qr, o[c]);
    }
  }
#pragma unroll
  for (int r = 0; r < kHeadRows; ++r) {
#pragma unroll
    for (int c = 0; c < kHeadCols; ++c) {
      if (kFull || (r < rows && lane + 32 * c < g.d_v)) __stcs(s_slice + r * dv + 32 * c, s[r][c]);
    }
  }
#pragma unroll
  for (int c = 0; c < kHeadCols; ++c) red[warp][lane + 32 * c] = o[c];
  __syncthreads();  // 4

  // Gated RMSNorm over the head's dv columns, by warps 0–3 (thread = column).
  float oj = 0.0f;
  if (tid < kHeadMaxD) {
#pragma unroll
    for (int w16 = 0; w16 < kHeadWarps; ++w16) oj = __fadd_rn(oj, red[w16][tid]);
    float sq_o = tid < g.d_v ? __fmul_rn(oj, oj) : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sq_o = __fadd_rn(sq_o, __shfl_xor_sync(kFullMask, sq_o, off));
    if (lane == 0) sq_part[0][warp] = sq_o;  // the L2 partials were read before barrier 2
    if (kPdl && tid == 0) {
      last_reader = readers_before == static_cast<unsigned>(g.r - 1);
      if (last_reader) *counter = 0u;
    }
  }
  __syncthreads();  // 5
  if (tid < g.d_v) {
    float ss = 0.0f;
#pragma unroll
    for (int w4 = 0; w4 < kHeadMaxD / 32; ++w4) ss = __fadd_rn(ss, sq_part[0][w4]);
    const float mean = __fdiv_rn(ss, static_cast<float>(g.d_v));
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, g.eps)));
    out[static_cast<size_t>(n) * g.value_dim + static_cast<size_t>(h) * g.d_v + tid] =
        __fmul_rn(__fmul_rn(__fmul_rn(oj, scale), nrm[tid]), zs[tid]);
  }
  // The last reader of kh's q/k history shifts it (its own reads are done: barrier 1).
  if (last_reader && part < 2 && e < g.d_k) {
    __threadfence();
    shift_history(g, slot.conv, x_qk, (part == 1 ? g.key_dim : 0) + kh * g.d_k + e);
  }
  if (prep.xprep != nullptr) prepare_finished_groups(g, prep, out, n, h);
}

using HeadKernel = void (*)(Geo, GdnDecodeWeights, GdnDecodeInputs, const GdnSlot*, unsigned*, float*, OutPrep);
HeadKernel head_kernel(bool programmatic, bool full, int n_seq) {
  if (programmatic && n_seq <= kGdnTapsAheadMaxSessions) {
    return full ? gdn_head_kernel<true, true, true> : gdn_head_kernel<true, false, true>;
  }
  if (programmatic) return full ? gdn_head_kernel<true, true, false> : gdn_head_kernel<true, false, false>;
  return full ? gdn_head_kernel<false, true, false> : gdn_head_kernel<false, false, false>;
}

bool head_kernel_serves(const Geo& g) { return g.d_k <= kHeadMaxD && g.d_v <= kHeadMaxD; }

// The kernel a call takes: the per-V-head kernel wherever it serves (every preset), at every batch size, so that a
// session's bits do not depend on its batch; the two-kernel path for larger heads, or where `forced` names it.
GdnKernel choose_kernel(const Geo& g, GdnKernel forced) {
  if (forced == GdnKernel::kTwoKernel || !head_kernel_serves(g)) return GdnKernel::kTwoKernel;
  return GdnKernel::kPerHead;
}

// The two-kernel path: the step with R rows of S per thread (R from dk), then the gated norm in place.
Status launch_two_kernel(const Geo& g, const GdnDecodeWeights& w, const GdnDecodeInputs& in, const GdnSlot* slots,
                         int n_seq, float* out, cudaStream_t stream) {
  const int rows = (g.d_k + kDeltaWarps - 1) / kDeltaWarps;
  if (rows <= 4) {
    launch_step<4>(g, w, in, slots, out, n_seq, stream);
  } else if (rows <= 8) {
    launch_step<8>(g, w, in, slots, out, n_seq, stream);
  } else if (rows <= 16) {
    launch_step<16>(g, w, in, slots, out, n_seq, stream);
  } else {
    launch_step<32>(g, w, in, slots, out, n_seq, stream);
  }
  KESTREL_CUDA_TRY(cudaGetLastError());
  gdn_norm_kernel<<<dim3(static_cast<unsigned>(g.n_v_heads), static_cast<unsigned>(n_seq)), 32, 0, stream>>>(
      g, w.ssm_norm, in, slots, out);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

size_t round4(size_t n) { return (n + 3) / 4 * 4; }

// Words of the workspace's first part: a counter per (session, K-head), the readers of its q/k history.
size_t readers_words(const ref::GdnDims& dims, int n_seq) {
  return round4(static_cast<size_t>(n_seq) * static_cast<size_t>(dims.n_k_heads));
}

Status invalid(const std::string& what) { return make_error(ErrorCode::kInvalidArgument, "gdn_decode: " + what); }

Status check_dims(const ref::GdnDims& dims) {
  KESTREL_TRY(dims.validate());
  if (dims.d_k > kGdnMaxDk) {
    return invalid("d_k " + std::to_string(dims.d_k) + " exceeds " + std::to_string(kGdnMaxDk));
  }
  if (dims.conv_kernel < 1) return invalid("conv_kernel " + std::to_string(dims.conv_kernel) + " must be >= 1");
  return ok_status();
}

}  // namespace

size_t gdn_decode_workspace_bytes(const ref::GdnDims& dims, int n_seq) {
  if (n_seq <= 0) return 0;
  const size_t groups =
      static_cast<size_t>(n_seq) * static_cast<size_t>(imma_prep::x_layout(dims.value_dim()).n_groups);
  return (readers_words(dims, n_seq) + round4(groups)) * sizeof(unsigned);  // readers, then the output's groups
}

Status gdn_decode(const ref::GdnDims& dims, ref::GdnProjection projection, const GdnDecodeWeights& w,
                  const GdnDecodeInputs& in, const GdnSlot* slots, int n_seq, float* out, void* workspace,
                  cudaStream_t stream, bool programmatic, const GdnDecodeTuning& tuning, void* out_prepared) {
  KESTREL_TRY(check_dims(dims));
  if (n_seq < 0 || n_seq > 65535) return invalid("n_seq " + std::to_string(n_seq) + " outside [0, 65535]");
  if (n_seq == 0) return ok_status();
  if (const std::string m = missing_weights_or_inputs(w, in, projection); !m.empty()) return invalid(m);
  if (slots == nullptr || out == nullptr || workspace == nullptr) return invalid("slots, out or workspace is null");
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) return invalid("workspace is not 16-byte aligned");
  if (out_prepared != nullptr) {
    if (imma_x_bytes(dims.value_dim(), n_seq) == 0) {
      return invalid("value_dim " + std::to_string(dims.value_dim()) +
                     " has no prepared form (a multiple of 64 up to gemv_imma's widest row)");
    }
    if (reinterpret_cast<uintptr_t>(out_prepared) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
      return invalid("out_prepared or out is not 16-byte aligned");
    }
  }
  const Geo g = make_geo(dims, projection, in.row_stride);
  if (choose_kernel(g, tuning.kernel) == GdnKernel::kTwoKernel) {
    KESTREL_TRY(launch_two_kernel(g, w, in, slots, n_seq, out, stream));
    return out_prepared == nullptr ? ok_status()
                                   : gemv_imma_prepare_x(out, dims.value_dim(), n_seq, out_prepared, stream);
  }
  OutPrep prep;
  if (out_prepared != nullptr) {
    prep.xprep = static_cast<uint8_t*>(out_prepared);
    prep.groups = static_cast<unsigned*>(workspace) + readers_words(dims, n_seq);
    prep.lay = imma_prep::x_layout(g.value_dim);
  }
  return launch_programmatic(programmatic, head_kernel(programmatic, g.d_k == kHeadMaxD && g.d_v == kHeadMaxD, n_seq),
                             dim3(static_cast<unsigned>(g.n_v_heads), static_cast<unsigned>(n_seq)), dim3(kHeadThreads),
                             0, stream, g, w, in, slots, static_cast<unsigned*>(workspace), out, prep);
}

Expected<GdnKernel> gdn_decode_kernel(const ref::GdnDims& dims, const GdnDecodeTuning& tuning) {
  KESTREL_TRY(check_dims(dims));
  return choose_kernel(make_geo(dims, ref::GdnProjection::kQkvGateBetaAlpha, 0), tuning.kernel);
}

int gdn_kernel_launches(GdnKernel kernel) { return kernel == GdnKernel::kTwoKernel ? 2 : 1; }

const char* gdn_kernel_name(GdnKernel kernel) {
  switch (kernel) {
    case GdnKernel::kPerHead: return "per-head";
    case GdnKernel::kTwoKernel: return "two-kernel";
    case GdnKernel::kAuto: break;
  }
  return "auto";
}

}  // namespace kestrel::gpu
