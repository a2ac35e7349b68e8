// gdn_chunked (see gdn_chunked.h): four kernels over one session's prompt tokens. Shared-memory tiles hold rows of up
// to kD = 128 elements: the [kC][kD] and [kC][kC] tiles at odd strides, so that a warp's column reads fall in distinct
// banks; the 32-column tiles at 36 floats, so that a thread's 8 columns are two aligned float4 reads.
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gdn_chunked.h"
#include "gpu/kernels/gdn_common.cuh"
#include "gpu/kernels/gdn_runs.h"
#include "gpu/kernels/smem_optin.cuh"

namespace kestrel::gpu {
namespace {

using namespace gdn_detail;  // NOLINT(google-build-using-namespace): the kernels' shared helpers

constexpr int kC = 64;         // tokens a chunk (the reference's)
constexpr int kD = kHeadMaxD;  // largest dk, dv (128)
constexpr int kLd = kD + 1;    // row stride of the [kC][kD] tiles
constexpr int kLa = kC + 1;    // row stride of the [kC][kC] tiles
constexpr int kLs = 36;        // row stride of the 32-column tiles (float4 reads)
constexpr int kThreads = 256;
constexpr int kSliceCols = 32;  // value columns of S a recurrence block holds

// Float offsets into the workspace, for T tokens.
struct Layout {
  int T, n_chunks;
  size_t qn, kn, vv, gl, bt, rec, o, rec_floats, end;
  // Within a record (chunk, V-head): W [kC][dk], U [kC][dv], P [kC][kC], Q⊙e^G [kC][dk], K⊙e^{G_last−G} [kC][dk],
  // e^{G_last}.
  size_t r_u, r_p, r_qg, r_kd, r_last;
};

size_t round4(size_t n) { return (n + 3) / 4 * 4; }

Layout layout_of(const ref::GdnDims& d, int T) {
  Layout L{};
  const size_t dk = static_cast<size_t>(d.d_k), dv = static_cast<size_t>(d.d_v);
  const size_t hk = static_cast<size_t>(d.n_k_heads), h = static_cast<size_t>(d.n_v_heads);
  L.T = T;
  L.n_chunks = (T + kC - 1) / kC;
  const size_t t = static_cast<size_t>(T);
  L.r_u = kC * dk;
  L.r_p = L.r_u + kC * dv;
  L.r_qg = L.r_p + kC * kC;
  L.r_kd = L.r_qg + kC * dk;
  L.r_last = L.r_kd + kC * dk;
  L.rec_floats = round4(L.r_last + 1);
  size_t off = 0;
  auto take = [&](size_t n) {
    const size_t at = off;
    off += round4(n);
    return at;
  };
  L.qn = take(t * hk * dk);
  L.kn = take(t * hk * dk);
  L.vv = take(t * h * dv);
  L.gl = take(t * h);
  L.bt = take(t * h);
  L.rec = take(static_cast<size_t>(L.n_chunks) * h * L.rec_floats);
  L.o = take(t * h * dv);
  L.end = off;
  return L;
}

// SiLU(conv) of channel c for token t (row t of the prompt): gdn_runs' ConvTaps arithmetic in its order, the taps
// before the prompt from the history.
__device__ __forceinline__ float conv_at(const Geo& g, const float* __restrict__ conv1d, const float* hist,
                                         const float* qkv, int t, int c) {
  const int nh = g.kernel - 1;
  const float* wc = conv1d + static_cast<size_t>(c) * g.kernel;
  const int xi = qkv_index(g, c);
  float y = 0.0f;
  for (int i = 0; i < nh; ++i) {
    const int p = t - nh + i;
    const float x =
        p >= 0 ? qkv[static_cast<size_t>(p) * g.qkv_stride + xi] : hist[static_cast<size_t>(c) * nh + nh + p];
    y = __fadd_rn(y, __fmul_rn(wc[i], x));
  }
  y = __fadd_rn(y, __fmul_rn(wc[nh], qkv[static_cast<size_t>(t) * g.qkv_stride + xi]));
  return silu_rn(y);
}

// dst[r·ld + e] = src[r·stride + e] for r < rows and e < cols, zero for the rest of the kRows × kCols tile, by the
// block's kThreads threads. With cols and stride multiples of 4 the rows are read as float4 (every source here is then
// 16-byte aligned: the workspace is, and its arrays and records start at multiples of 4 floats), each thread's loads
// all issued before its stores, so a tile costs about one L2 round trip rather than one per element a thread.
// kN threads take part, tid in [0, kN).
template <int kRows, int kCols, int kN = kThreads>
__device__ __forceinline__ void stage_tile(float* dst, int ld, const float* src, size_t stride, int rows, int cols,
                                           int tid) {
  constexpr int kQuads = kCols / 4;
  constexpr int kPer = (kRows * kQuads + kN - 1) / kN;
  static_assert(kCols % 4 == 0, "whole quads");
  if (cols % 4 == 0 && stride % 4 == 0) {
    float4 v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int idx = tid + u * kN;
      const int r = idx / kQuads;
      const int e = (idx % kQuads) * 4;
      v[u] = r < rows && e < cols ? *reinterpret_cast<const float4*>(src + static_cast<size_t>(r) * stride + e)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int idx = tid + u * kN;
      if (kRows * kQuads % kN != 0 && idx >= kRows * kQuads) break;
      float* d = dst + (idx / kQuads) * ld + (idx % kQuads) * 4;
      d[0] = v[u].x;
      d[1] = v[u].y;
      d[2] = v[u].z;
      d[3] = v[u].w;
    }
    return;
  }
  for (int idx = tid; idx < kRows * kCols; idx += kN) {
    const int r = idx / kCols;
    const int e = idx % kCols;
    dst[r * ld + e] = r < rows && e < cols ? src[static_cast<size_t>(r) * stride + e] : 0.0f;
  }
}

// (1) Block (tokens kPrepTokens·x .., y): y < Kh the q and k of K-head y (threads 0..127 q, 128..255 k: gdn_runs'
// warps), else the v of V-head y − Kh and its gates (β, and the log decay g = ssm_a · softplus(a + dt_bias)), the
// block's halves taking alternate tokens. Several tokens a block: a block of one token's few hundred operations cost
// about as much to schedule as to run.
constexpr int kPrepTokens = 8;

__global__ void __launch_bounds__(kThreads)
    prep_kernel(Geo g, GdnDecodeWeights w, GdnDecodeInputs in, GdnSlot slot, Layout L, float* __restrict__ ws) {
  __shared__ float sq_part[2][2][kD / 32];  // [token parity][q, k][warp]
  const int y = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int t_begin = static_cast<int>(blockIdx.x) * kPrepTokens;
  const int t_end = min(L.T, t_begin + kPrepTokens);
  if (y < g.n_k_heads) {
    const int part = tid / kD;
    const int e = tid % kD;
    const int ch = e < g.d_k ? (part == 1 ? g.key_dim : 0) + y * g.d_k + e : -1;
    for (int t = t_begin; t < t_end; ++t) {
      float(*sp)[kD / 32] = sq_part[t & 1];  // a thread reaches token t + 2 only after all have read token t's
      const float u = ch >= 0 ? conv_at(g, w.conv1d, slot.conv, in.qkv, t, ch) : 0.0f;
      float sq = __fmul_rn(u, u);
#pragma unroll
      for (int off = 16; off > 0; off /= 2) sq = __fadd_rn(sq, __shfl_xor_sync(kFullMask, sq, off));
      if (lane == 0) sp[part][warp % (kD / 32)] = sq;
      __syncthreads();
      float inv_q;
      float inv_k;
      inv_l2<kD / 32>(sp[0], sp[1], inv_q, inv_k);
      if (ch >= 0) {
        const size_t at = (static_cast<size_t>(t) * g.n_k_heads + y) * g.d_k + e;
        if (part == 0) {
          ws[L.qn + at] = __fmul_rn(__fmul_rn(u, inv_q), g.q_scale);
        } else {
          ws[L.kn + at] = __fmul_rn(u, inv_k);
        }
      }
    }
    return;
  }
  const int h = y - g.n_k_heads;
  const int c = tid % kD;
  for (int t = t_begin + tid / kD; t < t_end; t += kThreads / kD) {
    if (c < g.d_v) {
      const int ch = 2 * g.key_dim + h * g.d_v + c;
      ws[L.vv + (static_cast<size_t>(t) * g.n_v_heads + h) * g.d_v + c] =
          conv_at(g, w.conv1d, slot.conv, in.qkv, t, ch);
    }
    if (c == 0) {
      float b;
      float a;
      head_ba(g, in, t, h, b, a);
      const size_t at = static_cast<size_t>(t) * g.n_v_heads + h;
      ws[L.bt + at] = sigmoid_rn(b);
      ws[L.gl + at] = log_decay(w, a, h);
    }
  }
}

// (2) Block (chunk c, V-head h): the chunk-local matrices into the record of (c, h). Padding rows (past T) are zeros
// with β = 0 and g = 0: they change nothing. V takes Q's tile once Q's products are out (while one warp runs the
// forward substitution), so the tiles fit two blocks an SM.
constexpr size_t kLocalSmem = (2 * kC * kLd + kC * kLa + 4 * kC) * sizeof(float);
constexpr int kSideThreads = kThreads - 32;  // the warps beside the forward substitution
constexpr int kSideBarrier = 1;              // their named barrier (0 is __syncthreads')

__global__ void __launch_bounds__(kThreads, 2) local_kernel(Geo g, Layout L, float* __restrict__ ws) {
  extern __shared__ float sm[];
  float* ks = sm;             // [kC][kLd]
  float* qs = ks + kC * kLd;  // [kC][kLd]: Q, then V
  float* vs = qs;             // V's tile, from the side warps' staging on
  float* am = qs + kC * kLd;  // [kC][kLa]: A, then T − I
  float* gc = am + kC * kLa;  // G (inclusive cumulative log decay)
  float* bet = gc + kC;       // β
  float* eg = bet + kC;       // e^{G}
  float* el = eg + kC;        // e^{G_last − G}
  const int c = static_cast<int>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int kh = k_head_of(g, h);
  const int tid = static_cast<int>(threadIdx.x);
  const int t0 = c * kC;
  float* rec = ws + L.rec + (static_cast<size_t>(c) * g.n_v_heads + h) * L.rec_floats;

  {
    const int rows = min(kC, L.T - t0);
    const size_t kq = (static_cast<size_t>(t0) * g.n_k_heads + kh) * g.d_k;
    const size_t k_stride = static_cast<size_t>(g.n_k_heads) * g.d_k;
    stage_tile<kC, kD>(ks, kLd, ws + L.kn + kq, k_stride, rows, g.d_k, tid);
    stage_tile<kC, kD>(qs, kLd, ws + L.qn + kq, k_stride, rows, g.d_k, tid);
  }
  if (tid < kC) {
    const int t = t0 + tid;
    const size_t at = static_cast<size_t>(t) * g.n_v_heads + h;
    bet[tid] = t < L.T ? ws[L.bt + at] : 0.0f;
    gc[tid] = t < L.T ? ws[L.gl + at] : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {
    for (int i = 1; i < kC; ++i) gc[i] = __fadd_rn(gc[i - 1], gc[i]);
  }
  __syncthreads();
  if (tid < kC) {
    eg[tid] = expf(gc[tid]);
    el[tid] = expf(__fsub_rn(gc[kC - 1], gc[tid]));
  }

  // A and P by 4 × 4 tiles: k_i·k_j and q_i·k_j over the padded rows.
  {
    const int i0 = (tid / 16) * 4;
    const int j0 = (tid % 16) * 4;
    float akk[4][4] = {};
    float aqk[4][4] = {};
    if (j0 <= i0 + 3) {
      for (int e = 0; e < kD; ++e) {
        float ki[4], qi[4], kj[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          ki[x] = ks[(i0 + x) * kLd + e];
          qi[x] = qs[(i0 + x) * kLd + e];
          kj[x] = ks[(j0 + x) * kLd + e];
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            akk[a][b] = __fmaf_rn(ki[a], kj[b], akk[a][b]);
            aqk[a][b] = __fmaf_rn(qi[a], kj[b], aqk[a][b]);
          }
        }
      }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = i0 + a;
        const int j = j0 + b;
        const float dec = j <= i ? expf(__fsub_rn(gc[i], gc[j])) : 0.0f;
        am[i * kLa + j] = j < i ? -__fmul_rn(__fmul_rn(bet[i], akk[a][b]), dec) : 0.0f;
        rec[L.r_p + static_cast<size_t>(i) * kC + j] = j <= i ? __fmul_rn(aqk[a][b], dec) : 0.0f;
      }
    }
  }
  __syncthreads();

  // Forward substitution, rows in order (warp 0): row i += Σ_m row_i[m] · row_m, with row i as it was.
  if (tid < 32) {
    for (int i = 1; i < kC; ++i) {
      float v[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int j = tid + 32 * x;
        float s = 0.0f;
        if (j < i) {
          s = am[i * kLa + j];
          for (int m = j + 1; m < i; ++m) s = __fmaf_rn(am[i * kLa + m], am[m * kLa + j], s);
        }
        v[x] = s;
      }
      __syncwarp();
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int j = tid + 32 * x;
        if (j < i) am[i * kLa + j] = v[x];
      }
      __syncwarp();
    }
  } else {
    // Meanwhile the other warps: Q⊙e^G and K⊙e^{G_last − G} out, K becomes β⊙K⊙e^G in place (each element by one
    // thread); then V into Q's tile as β⊙V.
    const int st = tid - 32;
    for (int idx = st; idx < kC * kD; idx += kSideThreads) {
      const int i = idx / kD;
      const int e = idx % kD;
      const float k = ks[i * kLd + e];
      if (e < g.d_k) {
        rec[L.r_qg + static_cast<size_t>(i) * g.d_k + e] = __fmul_rn(qs[i * kLd + e], eg[i]);
        rec[L.r_kd + static_cast<size_t>(i) * g.d_k + e] = __fmul_rn(k, el[i]);
      }
      ks[i * kLd + e] = __fmul_rn(__fmul_rn(bet[i], k), eg[i]);
    }
    asm volatile("bar.sync %0, %1;" ::"n"(kSideBarrier), "n"(kSideThreads) : "memory");  // Q's tile is read
    stage_tile<kC, kD, kSideThreads>(vs, kLd, ws + L.vv + (static_cast<size_t>(t0) * g.n_v_heads + h) * g.d_v,
                                     static_cast<size_t>(g.n_v_heads) * g.d_v, min(kC, L.T - t0), g.d_v, st);
    asm volatile("bar.sync %0, %1;" ::"n"(kSideBarrier), "n"(kSideThreads) : "memory");
    for (int idx = st; idx < kC * kD; idx += kSideThreads) {
      const int i = idx / kD;
      const int e = idx % kD;
      vs[i * kLd + e] = __fmul_rn(bet[i], vs[i * kLd + e]);
    }
    if (st == 0) rec[L.r_last] = expf(gc[kC - 1]);
  }
  __syncthreads();

  // U = T (β⊙V), W = T (β⊙K⊙e^G), T = I + the substituted strict lower triangle: column e per thread, rows
  // alternating between the two halves of the block.
  const int e = tid % kD;
  for (int i = tid / kD; i < kC; i += 2) {
    float u = vs[i * kLd + e];
    float wv = ks[i * kLd + e];
    for (int j = 0; j < i; ++j) {
      const float a = am[i * kLa + j];
      u = __fmaf_rn(a, vs[j * kLd + e], u);
      wv = __fmaf_rn(a, ks[j * kLd + e], wv);
    }
    if (e < g.d_v) rec[L.r_u + static_cast<size_t>(i) * g.d_v + e] = u;
    if (e < g.d_k) rec[static_cast<size_t>(i) * g.d_k + e] = wv;
  }
}

// acc[b] += Σ_{r < n} a[r] · m[r·kLs + b] for b < 8, r in order (m: 8 columns of a [.][kLs] tile, 16-byte aligned).
__device__ __forceinline__ void row_times(const float* a, const float* m, int n, float (&acc)[8]) {
  for (int r = 0; r < n; ++r) {
    const float x = a[r];
    const float4 m0 = *reinterpret_cast<const float4*>(m + r * kLs);
    const float4 m1 = *reinterpret_cast<const float4*>(m + r * kLs + 4);
    const float mv[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
#pragma unroll
    for (int b = 0; b < 8; ++b) acc[b] = __fmaf_rn(x, mv[b], acc[b]);
  }
}

// (3) Block (V-head h, value columns j0 .. j0 + 31): the state's columns through the chunks in order, each chunk's
// output rows of those columns into o.
constexpr size_t kStateSmem = (kD * kLs + 3 * kC * kLd + kC * kLa + kC * kLs) * sizeof(float);

__global__ void __launch_bounds__(kThreads, 1) state_kernel(Geo g, Layout L, GdnSlot slot, float* __restrict__ ws) {
  extern __shared__ float sm[];
  float* ss = sm;              // [kD][kLs]: S rows e, columns j0 ..
  float* wsm = ss + kD * kLs;  // [kC][kLd]
  float* qg = wsm + kC * kLd;  // [kC][kLd]
  float* kd = qg + kC * kLd;   // [kC][kLd]
  float* pm = kd + kC * kLd;   // [kC][kLa]
  float* vp = pm + kC * kLa;   // [kC][kLs]: U, then V' = U − W S
  const int h = static_cast<int>(blockIdx.x);
  const int j0 = static_cast<int>(blockIdx.y) * kSliceCols;
  const int tid = static_cast<int>(threadIdx.x);
  float* s_head = slot.s + static_cast<size_t>(h) * g.d_k * g.d_v;
  for (int idx = tid; idx < kD * kSliceCols; idx += kThreads) {
    const int e = idx / kSliceCols;
    const int j = idx % kSliceCols;
    ss[e * kLs + j] = e < g.d_k && j0 + j < g.d_v ? s_head[static_cast<size_t>(e) * g.d_v + j0 + j] : 0.0f;
  }
  const int i = tid / 4;  // V' and O: row i, columns jq .. jq + 7
  const int jq = (tid % 4) * 8;
  const int es = tid / 2;  // S update: row es, columns jh .. jh + 15
  const int jh = (tid % 2) * 16;
  for (int c = 0; c < L.n_chunks; ++c) {
    const float* rec = ws + L.rec + (static_cast<size_t>(c) * g.n_v_heads + h) * L.rec_floats;
    stage_tile<kC, kD>(wsm, kLd, rec, g.d_k, kC, g.d_k, tid);
    stage_tile<kC, kD>(qg, kLd, rec + L.r_qg, g.d_k, kC, g.d_k, tid);
    stage_tile<kC, kD>(kd, kLd, rec + L.r_kd, g.d_k, kC, g.d_k, tid);
    stage_tile<kC, kC>(pm, kLa, rec + L.r_p, kC, kC, kC, tid);
    stage_tile<kC, kSliceCols>(vp, kLs, rec + L.r_u + j0, g.d_v, kC, min(kSliceCols, g.d_v - j0), tid);
    const float last = rec[L.r_last];
    __syncthreads();

    float acc[8] = {};
    row_times(wsm + i * kLd, ss + jq, kD, acc);
#pragma unroll
    for (int b = 0; b < 8; ++b) vp[i * kLs + jq + b] = __fsub_rn(vp[i * kLs + jq + b], acc[b]);
    __syncthreads();

    float o[8] = {};
    row_times(qg + i * kLd, ss + jq, kD, o);
    row_times(pm + i * kLa, vp + jq, i + 1, o);
    const int t = c * kC + i;
    if (t < L.T) {
      float* orow = ws + L.o + (static_cast<size_t>(t) * g.n_v_heads + h) * g.d_v;
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        if (j0 + jq + b < g.d_v) orow[j0 + jq + b] = o[b];
      }
    }
    __syncthreads();  // every read of S for this chunk is done

    float s[16];
#pragma unroll
    for (int b = 0; b < 16; ++b) s[b] = __fmul_rn(ss[es * kLs + jh + b], last);
    for (int r = 0; r < kC; ++r) {
      const float k = kd[r * kLd + es];
#pragma unroll
      for (int b4 = 0; b4 < 4; ++b4) {
        const float4 v = *reinterpret_cast<const float4*>(vp + r * kLs + jh + 4 * b4);
        s[4 * b4] = __fmaf_rn(k, v.x, s[4 * b4]);
        s[4 * b4 + 1] = __fmaf_rn(k, v.y, s[4 * b4 + 1]);
        s[4 * b4 + 2] = __fmaf_rn(k, v.z, s[4 * b4 + 2]);
        s[4 * b4 + 3] = __fmaf_rn(k, v.w, s[4 * b4 + 3]);
      }
    }
#pragma unroll
    for (int b = 0; b < 16; ++b) ss[es * kLs + jh + b] = s[b];
    __syncthreads();  // S is whole again, and the chunk's tiles may be overwritten
  }
  for (int idx = tid; idx < kD * kSliceCols; idx += kThreads) {
    const int e = idx / kSliceCols;
    const int j = idx % kSliceCols;
    if (e < g.d_k && j0 + j < g.d_v) s_head[static_cast<size_t>(e) * g.d_v + j0 + j] = ss[e * kLs + j];
  }
}

// (4) Block (tokens kPostTokens·x .., V-head h), kD threads: the gated RMSNorm of o (gdn_runs' arithmetic); the blocks
// of the first tokens also write the conv history after the prompt (v channels of head h; q and k channels of K-head
// h for h < Kh).
constexpr int kPostTokens = 8;

__global__ void __launch_bounds__(kD) post_kernel(Geo g, GdnDecodeWeights w, GdnDecodeInputs in, GdnSlot slot, Layout L,
                                                  const float* __restrict__ ws, float* __restrict__ out) {
  __shared__ float sq_part[2][kD / 32];  // [token parity][warp]
  const int h = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int t_begin = static_cast<int>(blockIdx.x) * kPostTokens;
  const int t_end = min(L.T, t_begin + kPostTokens);
  for (int t = t_begin; t < t_end; ++t) {
    float* sp = sq_part[t & 1];  // a thread reaches token t + 2 only after all have read token t's
    float oj = 0.0f;
    float zs = 0.0f;
    if (tid < g.d_v) {
      oj = ws[L.o + (static_cast<size_t>(t) * g.n_v_heads + h) * g.d_v + tid];
      const float* row = in.qkv + static_cast<size_t>(t) * g.qkv_stride;
      zs = silu_rn(g.proj == 2 ? row[z_index(g, h, tid)]
                               : in.z[static_cast<size_t>(t) * g.z_stride + static_cast<size_t>(h) * g.d_v + tid]);
    }
    float sq_o = tid < g.d_v ? __fmul_rn(oj, oj) : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sq_o = __fadd_rn(sq_o, __shfl_xor_sync(kFullMask, sq_o, off));
    if (lane == 0) sp[tid / 32] = sq_o;
    __syncthreads();
    if (tid < g.d_v) {
      float ss = 0.0f;
#pragma unroll
      for (int w4 = 0; w4 < kD / 32; ++w4) ss = __fadd_rn(ss, sp[w4]);
      const float mean = __fdiv_rn(ss, static_cast<float>(g.d_v));
      const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, g.eps)));
      out[static_cast<size_t>(t) * g.value_dim + static_cast<size_t>(h) * g.d_v + tid] =
          __fmul_rn(__fmul_rn(__fmul_rn(oj, scale), w.ssm_norm[tid]), zs);
    }
  }
  if (blockIdx.x != 0) return;
  // The history after the prompt: the last K − 1 inputs of (history, prompt). Index i reads position T − nh + i, an
  // input row or history entry nh + p > i: never one this loop wrote.
  const int nh = g.kernel - 1;
  auto write_history = [&](int ch) {
    const int xi = qkv_index(g, ch);
    float* hc = slot.conv + static_cast<size_t>(ch) * nh;
    for (int i = 0; i < nh; ++i) {
      const int p = L.T - nh + i;
      hc[i] = p >= 0 ? in.qkv[static_cast<size_t>(p) * g.qkv_stride + xi] : hc[nh + p];
    }
  };
  if (tid < g.d_v) write_history(2 * g.key_dim + h * g.d_v + tid);
  if (h < g.n_k_heads && tid < g.d_k) {
    write_history(h * g.d_k + tid);
    write_history(g.key_dim + h * g.d_k + tid);
  }
}

Status invalid(const std::string& what) { return make_error(ErrorCode::kInvalidArgument, "gdn_chunked: " + what); }

}  // namespace

bool gdn_chunked_supported(const ref::GdnDims& dims) { return gdn_runs_supported(dims); }

size_t gdn_chunked_workspace_bytes(const ref::GdnDims& dims, int max_tokens) {
  if (!gdn_chunked_supported(dims) || max_tokens < 1) return 0;
  return layout_of(dims, max_tokens).end * sizeof(float);
}

Status gdn_chunked(const ref::GdnDims& dims, ref::GdnProjection projection, const GdnDecodeWeights& w,
                   const GdnDecodeInputs& in, const GdnSlot& slot, int n_tok, float* out, void* workspace,
                   cudaStream_t stream) {
  if (!gdn_chunked_supported(dims)) {
    return make_error(ErrorCode::kUnsupported, "gdn_chunked: these GDN heads (dk " + std::to_string(dims.d_k) +
                                                   ", dv " + std::to_string(dims.d_v) + ", conv kernel " +
                                                   std::to_string(dims.conv_kernel) + ") are not served");
  }
  if (n_tok < 1 || n_tok > 65535) return invalid("n_tok " + std::to_string(n_tok) + " outside [1, 65535]");
  if (const std::string m = missing_weights_or_inputs(w, in, projection); !m.empty()) return invalid(m);
  if (slot.s == nullptr || (slot.conv == nullptr && dims.conv_kernel > 1) || out == nullptr || workspace == nullptr) {
    return invalid("slot, out or workspace is null");
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) return invalid("workspace is not 16-byte aligned");
  KESTREL_TRY(check_smem<local_kernel>(kLocalSmem, "gdn_chunked: the chunk-local tiles"));
  KESTREL_TRY(check_smem<state_kernel>(kStateSmem, "gdn_chunked: the recurrence's tiles"));
  const Geo g = make_geo(dims, projection, in.row_stride);
  const Layout L = layout_of(dims, n_tok);
  auto* ws = static_cast<float*>(workspace);
  const unsigned T = static_cast<unsigned>(n_tok);
  prep_kernel<<<dim3((T + kPrepTokens - 1) / kPrepTokens, static_cast<unsigned>(g.n_k_heads + g.n_v_heads)), kThreads,
                0, stream>>>(g, w, in, slot, L, ws);
  KESTREL_CUDA_TRY(cudaGetLastError());
  local_kernel<<<dim3(static_cast<unsigned>(L.n_chunks), static_cast<unsigned>(g.n_v_heads)), kThreads, kLocalSmem,
                 stream>>>(g, L, ws);
  KESTREL_CUDA_TRY(cudaGetLastError());
  state_kernel<<<dim3(static_cast<unsigned>(g.n_v_heads), static_cast<unsigned>((g.d_v + kSliceCols - 1) / kSliceCols)),
                 kThreads, kStateSmem, stream>>>(g, L, slot, ws);
  KESTREL_CUDA_TRY(cudaGetLastError());
  post_kernel<<<dim3((T + kPostTokens - 1) / kPostTokens, static_cast<unsigned>(g.n_v_heads)), kD, 0, stream>>>(
      g, w, in, slot, L, ws, out);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
