// Device helpers and geometry shared by the GDN kernels (gdn_decode.cu, gdn_runs.cu): the index arithmetic of the
// projection layouts, the conv taps, the gates and the per-V-head kernel's block shape. Everything a token's
// arithmetic goes through lives here once, so the kernels that run one token and those that run a session's
// consecutive tokens give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "core/base/expected.h"
#include "core/reference/gdn_layer.h"  // ref::GdnProjection
#include "core/reference/gdn_state.h"  // ref::GdnDims
#include "gpu/kernels/gdn_decode.h"    // GdnDecodeWeights, GdnDecodeInputs

namespace kestrel::gpu::gdn_detail {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Geometry shared by the kernels (plain ints, passed by value).
struct Geo {
  int n_k_heads, n_v_heads, d_k, d_v, kernel, r;
  int key_dim, value_dim, conv_dim;
  int qkv_stride;  // floats per session row of in.qkv (C, or C + Vd for kSsmInBa; in.row_stride when set)
  int z_stride;    // of in.z (Vd, or in.row_stride)
  int ab_stride;   // of in.b and in.a (Vh, or in.row_stride)
  int ba_stride;   // of in.ba (2·Vh, or in.row_stride)
  int group;       // kSsmInBa: floats per K-group of qkvz (2·dk + 2·r·dv)
  bool tiled;      // HeadMapping::kTiled
  int proj;        // 0 kQkvGateBetaAlpha, 1 kQkvGateBa, 2 kSsmInBa
  float eps;       // gated-norm eps
  float q_scale;   // f32(1/sqrt(dk)) computed in double
};

__device__ __forceinline__ float sigmoid_rn(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float silu_rn(float x) { return __fmul_rn(x, sigmoid_rn(x)); }
__device__ __forceinline__ float softplus_rn(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ int k_head_of(const Geo& g, int h) { return g.tiled ? h % g.n_k_heads : h / g.r; }

// Index into one session's qkv row of the raw input of mixed_qkv channel c.
__device__ __forceinline__ int qkv_index(const Geo& g, int c) {
  if (g.proj != 2) return c;
  if (c < g.key_dim) return (c / g.d_k) * g.group + c % g.d_k;  // q
  if (c < 2 * g.key_dim) {                                      // k
    const int ck = c - g.key_dim;
    return (ck / g.d_k) * g.group + g.d_k + ck % g.d_k;
  }
  const int cv = c - 2 * g.key_dim;  // v: V-heads g·r … g·r + r − 1 of K-group g
  const int rdv = g.r * g.d_v;
  return (cv / rdv) * g.group + 2 * g.d_k + cv % rdv;
}

// Index into one session's legacy qkvz row (kSsmInBa) of z[h·dv + e]: V-heads g·r … g·r + r − 1 of K-group g.
__device__ __forceinline__ int z_index(const Geo& g, int h, int e) {
  const int zi = h * g.d_v + e;
  const int rdv = g.r * g.d_v;
  return (zi / rdv) * g.group + 2 * g.d_k + rdv + zi % rdv;
}

// SiLU(conv over (history, x)) of channel c; taps summed in order i = 0..K−1. Reads the history only.
__device__ __forceinline__ float conv_channel(const Geo& g, const float* __restrict__ w, const float* hist, float x,
                                              int c) {
  const int nh = g.kernel - 1;
  const float* wc = w + static_cast<size_t>(c) * g.kernel;
  const float* hc = hist + static_cast<size_t>(c) * nh;
  float y = 0.0f;
  for (int i = 0; i < nh; ++i) y = __fadd_rn(y, __fmul_rn(wc[i], hc[i]));
  y = __fadd_rn(y, __fmul_rn(wc[nh], x));
  return silu_rn(y);
}

// Drops the oldest history column of channel c and appends x.
__device__ __forceinline__ void shift_history(const Geo& g, float* hist, float x, int c) {
  const int nh = g.kernel - 1;
  float* hc = hist + static_cast<size_t>(c) * nh;
  for (int i = 0; i + 1 < nh; ++i) hc[i] = hc[i + 1];
  if (nh > 0) hc[nh - 1] = x;
}

// Σ v[i]² over i < n by one warp (lane-strided, index order within a lane) then a butterfly; in every lane.
__device__ __forceinline__ float warp_sum_squares(const float* v, int n, int lane) {
  float s = 0.0f;
  for (int i = lane; i < n; i += 32) s = __fadd_rn(s, __fmul_rn(v[i], v[i]));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s = __fadd_rn(s, __shfl_xor_sync(kFullMask, s, off));
  return s;
}

// The q and k L2 norms' 1/sqrt(Σ + 1e-6) from N per-warp partial sums of squares each (q_part, k_part), added in warp
// order.
template <int N>
__device__ __forceinline__ void inv_l2(const float* q_part, const float* k_part, float& inv_q, float& inv_k) {
  float ssq = 0.0f;
  float ssk = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    ssq = __fadd_rn(ssq, q_part[i]);
    ssk = __fadd_rn(ssk, k_part[i]);
  }
  inv_q = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ssq, 1e-6f)));
  inv_k = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ssk, 1e-6f)));
}

// The gate inputs b and a of V-head h in row n of the inputs, as the projection layout keeps them.
__device__ __forceinline__ void head_ba(const Geo& g, const GdnDecodeInputs& in, int n, int h, float& b, float& a) {
  if (g.proj == 0) {
    b = in.b[static_cast<size_t>(n) * g.ab_stride + h];
    a = in.a[static_cast<size_t>(n) * g.ab_stride + h];
  } else {  // ba per K-group [b(r), a(r)], heads in grouped order (ref::gdn_split_ba)
    const float* ba = in.ba + static_cast<size_t>(n) * g.ba_stride + (h / g.r) * 2 * g.r;
    b = ba[h % g.r];
    a = ba[g.r + h % g.r];
  }
}

// The log decay of V-head h: ssm_a · softplus(a + dt_bias) (<= 0; the decay is its exponential).
__device__ __forceinline__ float log_decay(const GdnDecodeWeights& w, float a, int h) {
  return __fmul_rn(w.ssm_a[h], softplus_rn(__fadd_rn(a, w.dt_bias[h])));
}

// The gates of V-head h of session n into gates[0..1]: beta = sigmoid(b), decay = exp(log_decay).
__device__ __forceinline__ void head_gates(const Geo& g, const GdnDecodeWeights& w, const GdnDecodeInputs& in, int n,
                                           int h, float* gates) {
  float b;
  float a;
  head_ba(g, in, n, h, b, a);
  gates[0] = sigmoid_rn(b);
  gates[1] = expf(log_decay(w, a, h));
}

constexpr int kHeadWarps = 16;
constexpr int kHeadThreads = 32 * kHeadWarps;

// One channel's conv taps and history in registers (conv kernels of up to kConvTapsAhead taps), loaded ahead of the
// input; conv() is conv_channel's arithmetic in its order.
constexpr int kConvTapsAhead = 4;
struct ConvTaps {
  float w[kConvTapsAhead] = {};
  float h[kConvTapsAhead - 1] = {};
  __device__ __forceinline__ void load(const Geo& g, const float* __restrict__ conv1d, const float* hist, int c) {
    const int nh = g.kernel - 1;
#pragma unroll
    for (int i = 0; i < kConvTapsAhead; ++i) {
      if (i <= nh) w[i] = conv1d[static_cast<size_t>(c) * g.kernel + i];
      if (i < nh) h[i] = hist[static_cast<size_t>(c) * nh + i];
    }
  }
  __device__ __forceinline__ float conv(const Geo& g, float x) const {
    const int nh = g.kernel - 1;
    float y = 0.0f;
    float last = w[0];
#pragma unroll
    for (int i = 0; i < kConvTapsAhead - 1; ++i) {
      if (i < nh) y = __fadd_rn(y, __fmul_rn(w[i], h[i]));
      if (i + 1 == nh) last = w[i + 1];
    }
    y = __fadd_rn(y, __fmul_rn(last, x));
    return silu_rn(y);
  }
  // Drops the oldest history column and appends x (shift_history's result, kept in registers).
  __device__ __forceinline__ void push(const Geo& g, float x) {
    const int nh = g.kernel - 1;
#pragma unroll
    for (int i = 0; i < kConvTapsAhead - 1; ++i) {
      if (i + 1 < nh) h[i] = h[i + 1];
      if (i + 1 == nh) h[i] = x;
    }
  }
  // Writes the history back to channel c of hist.
  __device__ __forceinline__ void store(const Geo& g, float* hist, int c) const {
    const int nh = g.kernel - 1;
#pragma unroll
    for (int i = 0; i < kConvTapsAhead - 1; ++i) {
      if (i < nh) hist[static_cast<size_t>(c) * nh + i] = h[i];
    }
  }
};
constexpr int kHeadRows = 8;  // rows of S_h per warp
constexpr int kHeadCols = 4;  // columns of S_h per lane
constexpr int kHeadMaxD = kHeadWarps * kHeadRows;
static_assert(kHeadMaxD == 32 * kHeadCols, "the per-V-head kernel covers dk and dv up to the same bound");

// The kernels' geometry for dims and a projection layout (row_stride: GdnDecodeInputs::row_stride).
inline Geo make_geo(const ref::GdnDims& dims, ref::GdnProjection projection, int row_stride) {
  Geo g{};
  g.n_k_heads = dims.n_k_heads;
  g.n_v_heads = dims.n_v_heads;
  g.d_k = dims.d_k;
  g.d_v = dims.d_v;
  g.kernel = dims.conv_kernel;
  g.r = dims.v_per_k();
  g.key_dim = dims.key_dim();
  g.value_dim = dims.value_dim();
  g.conv_dim = dims.conv_dim();
  g.proj = projection == ref::GdnProjection::kQkvGateBetaAlpha ? 0
           : projection == ref::GdnProjection::kQkvGateBa      ? 1
                                                               : 2;
  g.qkv_stride = row_stride > 0 ? row_stride : g.proj == 2 ? g.conv_dim + g.value_dim : g.conv_dim;
  g.z_stride = row_stride > 0 ? row_stride : g.value_dim;
  g.ab_stride = row_stride > 0 ? row_stride : g.n_v_heads;
  g.ba_stride = row_stride > 0 ? row_stride : 2 * g.n_v_heads;
  g.group = 2 * g.d_k + 2 * g.r * g.d_v;
  g.tiled = dims.mapping == HeadMapping::kTiled;
  g.eps = dims.eps;
  g.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dims.d_k)));
  return g;
}

// What is missing among a layer's weights and a projection layout's inputs, as the text of an argument error (empty
// when nothing is): the checks every GDN entry point makes before it enqueues anything.
inline const char* missing_weights_or_inputs(const GdnDecodeWeights& w, const GdnDecodeInputs& in,
                                             ref::GdnProjection projection) {
  if (w.conv1d == nullptr || w.dt_bias == nullptr || w.ssm_a == nullptr || w.ssm_norm == nullptr) {
    return "a layer weight (conv1d, dt_bias, ssm_a, ssm_norm) is null";
  }
  if (in.qkv == nullptr) return "inputs.qkv is null";
  switch (projection) {
    case ref::GdnProjection::kQkvGateBetaAlpha:
      if (in.z == nullptr || in.b == nullptr || in.a == nullptr) return "inputs z, b or a is null";
      break;
    case ref::GdnProjection::kQkvGateBa:
      if (in.z == nullptr || in.ba == nullptr) return "inputs z or ba is null";
      break;
    case ref::GdnProjection::kSsmInBa:
      if (in.ba == nullptr) return "inputs.ba is null";
      break;
  }
  return "";
}

}  // namespace kestrel::gpu::gdn_detail
