// gdn_decode (see gdn_decode.h): three kernels per step.
//
//   prep   grid (Kh, n_seq), 128 threads: block (kh, n) owns the channels q_kh, k_kh and v_h of every V-head h that
//          reads kh (the heads of each K-head partition the V-heads under both mappings), so each history column
//          is read and rewritten by exactly one thread. Conv + SiLU, L2 norm of q/k (warp 0, lane-strided partial
//          sums then a butterfly), scale, the gates of those V-heads; q̂, k̂, v, beta, g go to the workspace.
//   delta  grid (⌈dv/32⌉, Vh, n_seq), 256 threads = 8 warps: lane l owns column j = 32·blockIdx.x + l, warp w owns
//          rows [w·R, w·R + R) of S_h (R = ⌈dk/8⌉ rounded up to 4/8/16/32, a template), held in registers: one
//          coalesced read (a warp reads 128 contiguous bytes of a row) and one write of S per step. Column sums
//          (m = Sᵀk̂, o = Sᵀq̂) are per-warp partial sums in row order, then the 8 warps' partials added in warp
//          order through shared memory.
//   norm   grid (Vh, n_seq), one warp: sum of squares of o_h (lane-strided, butterfly), then the gated RMSNorm.
// Element-wise arithmetic that the reference does without FMA (conv taps, delta-rule products, norms) uses
// __fmul_rn/__fadd_rn so nvcc cannot contract it; differences from the reference are summation order and the
// device's expf/log1pf (≤ 2 ulp), which is what the test tolerance covers.
#include <cmath>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/gdn_decode.h"

namespace kestrel::gpu {
namespace {

constexpr int kPrepThreads = 128;
constexpr int kDeltaWarps = 8;
constexpr int kDeltaThreads = 32 * kDeltaWarps;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Geometry shared by the kernels (plain ints, passed by value).
struct Geo {
  int n_k_heads, n_v_heads, d_k, d_v, kernel, r;
  int key_dim, value_dim, conv_dim;
  int qkv_stride;  // floats per session row of in.qkv (C, or C + Vd for kSsmInBa)
  int group;       // kSsmInBa: floats per K-group of qkvz (2·dk + 2·r·dv)
  bool tiled;      // HeadMapping::kTiled
  int proj;        // 0 kQkvGateBetaAlpha, 1 kQkvGateBa, 2 kSsmInBa
  float eps;       // gated-norm eps
  float q_scale;   // f32(1/sqrt(dk)) computed in double
};

// Workspace views (floats).
struct Ws {
  float* q;     // [n_seq][Kh][dk]
  float* k;     // [n_seq][Kh][dk]
  float* v;     // [n_seq][Vd]
  float* beta;  // [n_seq][Vh]
  float* g;     // [n_seq][Vh]
  float* o;     // [n_seq][Vd]
};

size_t round4(size_t n) { return (n + 3) / 4 * 4; }

Ws carve(const ref::GdnDims& d, int n_seq, void* base) {
  const size_t n = static_cast<size_t>(n_seq);
  float* p = static_cast<float*>(base);
  Ws ws{};
  ws.q = p;
  p += round4(n * static_cast<size_t>(d.key_dim()));
  ws.k = p;
  p += round4(n * static_cast<size_t>(d.key_dim()));
  ws.v = p;
  p += round4(n * static_cast<size_t>(d.value_dim()));
  ws.beta = p;
  p += round4(n * static_cast<size_t>(d.n_v_heads));
  ws.g = p;
  p += round4(n * static_cast<size_t>(d.n_v_heads));
  ws.o = p;
  return ws;
}

__device__ __forceinline__ float sigmoid_rn(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float silu_rn(float x) { return __fmul_rn(x, sigmoid_rn(x)); }
__device__ __forceinline__ float softplus_rn(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// V-head number j < r of K-head kh.
__device__ __forceinline__ int v_head_of(const Geo& g, int kh, int j) {
  return g.tiled ? kh + j * g.n_k_heads : kh * g.r + j;
}

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

// Conv over (history, x) of channel c, SiLU; rewrites the channel's history. Taps summed in order i = 0..K−1.
__device__ __forceinline__ float conv_channel(const Geo& g, const float* __restrict__ w, float* __restrict__ hist,
                                              float x, int c) {
  const int nh = g.kernel - 1;
  const float* wc = w + static_cast<size_t>(c) * g.kernel;
  float* hc = hist + static_cast<size_t>(c) * nh;
  float y = 0.0f;
  for (int i = 0; i < nh; ++i) y = __fadd_rn(y, __fmul_rn(wc[i], hc[i]));
  y = __fadd_rn(y, __fmul_rn(wc[nh], x));
  for (int i = 0; i + 1 < nh; ++i) hc[i] = hc[i + 1];
  if (nh > 0) hc[nh - 1] = x;
  return silu_rn(y);
}

// Σ v[i]² over i < n, by warp 0's lanes (lane-strided, index order) then a butterfly; the result in every lane.
__device__ __forceinline__ float warp_sum_squares(const float* v, int n, int lane) {
  float s = 0.0f;
  for (int i = lane; i < n; i += 32) s = __fadd_rn(s, __fmul_rn(v[i], v[i]));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s = __fadd_rn(s, __shfl_xor_sync(kFullMask, s, off));
  return s;
}

__global__ void __launch_bounds__(kPrepThreads)
    gdn_prep_kernel(Geo g, GdnDecodeWeights w, GdnDecodeInputs in, const GdnSlot* __restrict__ slots, Ws ws) {
  __shared__ float uq[kGdnMaxDk];
  __shared__ float uk[kGdnMaxDk];
  __shared__ float inv_norm[2];
  const int kh = static_cast<int>(blockIdx.x);
  const int n = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const GdnSlot slot = slots[n];
  const float* row = in.qkv + static_cast<size_t>(n) * g.qkv_stride;

  // q and k channels of kh.
  for (int t = tid; t < 2 * g.d_k; t += kPrepThreads) {
    const int c = t < g.d_k ? kh * g.d_k + t : g.key_dim + kh * g.d_k + (t - g.d_k);
    const float u = conv_channel(g, w.conv1d, slot.conv, row[qkv_index(g, c)], c);
    if (t < g.d_k) {
      uq[t] = u;
    } else {
      uk[t - g.d_k] = u;
    }
  }
  // v channels of the V-heads that read kh.
  const int n_v = g.r * g.d_v;
  for (int t = tid; t < n_v; t += kPrepThreads) {
    const int h = v_head_of(g, kh, t / g.d_v);
    const int e = t % g.d_v;
    const int c = 2 * g.key_dim + h * g.d_v + e;
    ws.v[static_cast<size_t>(n) * g.value_dim + h * g.d_v + e] =
        conv_channel(g, w.conv1d, slot.conv, row[qkv_index(g, c)], c);
  }
  // Gates of those V-heads.
  for (int j = tid; j < g.r; j += kPrepThreads) {
    const int h = v_head_of(g, kh, j);
    float b;
    float a;
    if (g.proj == 0) {
      b = in.b[static_cast<size_t>(n) * g.n_v_heads + h];
      a = in.a[static_cast<size_t>(n) * g.n_v_heads + h];
    } else {  // ba per K-group [b(r), a(r)], heads in grouped order (ref::gdn_split_ba)
      const float* ba = in.ba + static_cast<size_t>(n) * 2 * g.n_v_heads + (h / g.r) * 2 * g.r;
      b = ba[h % g.r];
      a = ba[g.r + h % g.r];
    }
    ws.beta[static_cast<size_t>(n) * g.n_v_heads + h] = sigmoid_rn(b);
    ws.g[static_cast<size_t>(n) * g.n_v_heads + h] = __fmul_rn(w.ssm_a[h], softplus_rn(__fadd_rn(a, w.dt_bias[h])));
  }
  __syncthreads();
  if (tid < 32) {
    const float sq = warp_sum_squares(uq, g.d_k, tid);
    const float sk = warp_sum_squares(uk, g.d_k, tid);
    if (tid == 0) {
      inv_norm[0] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sq, 1e-6f)));
      inv_norm[1] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sk, 1e-6f)));
    }
  }
  __syncthreads();
  const size_t base = static_cast<size_t>(n) * g.key_dim + static_cast<size_t>(kh) * g.d_k;
  for (int i = tid; i < g.d_k; i += kPrepThreads) {
    ws.q[base + i] = __fmul_rn(__fmul_rn(uq[i], inv_norm[0]), g.q_scale);
    ws.k[base + i] = __fmul_rn(uk[i], inv_norm[1]);
  }
}

template <int R>
__global__ void __launch_bounds__(kDeltaThreads) gdn_delta_kernel(Geo g, const GdnSlot* __restrict__ slots, Ws ws) {
  __shared__ float qs[kDeltaWarps * R];
  __shared__ float ks[kDeltaWarps * R];
  __shared__ float red[kDeltaWarps][32];
  const int h = static_cast<int>(blockIdx.y);
  const int n = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int kh = g.tiled ? h % g.n_k_heads : h / g.r;
  const size_t kbase = static_cast<size_t>(n) * g.key_dim + static_cast<size_t>(kh) * g.d_k;
  for (int i = tid; i < kDeltaWarps * R; i += kDeltaThreads) {
    qs[i] = i < g.d_k ? ws.q[kbase + i] : 0.0f;
    ks[i] = i < g.d_k ? ws.k[kbase + i] : 0.0f;
  }
  const int j = static_cast<int>(blockIdx.x) * 32 + lane;
  const bool col_ok = j < g.d_v;
  float* sh = slots[n].s + static_cast<size_t>(h) * g.d_k * g.d_v;
  const int i0 = warp * R;

  float s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = i0 + r;
    s[r] = (col_ok && i < g.d_k) ? __ldcs(sh + static_cast<size_t>(i) * g.d_v + j) : 0.0f;
  }
  const float decay = expf(ws.g[static_cast<size_t>(n) * g.n_v_heads + h]);
  const float beta = ws.beta[static_cast<size_t>(n) * g.n_v_heads + h];
  const float vj = col_ok ? ws.v[static_cast<size_t>(n) * g.value_dim + static_cast<size_t>(h) * g.d_v + j] : 0.0f;
  __syncthreads();  // qs/ks staged

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
  const float delta = __fmul_rn(__fsub_rn(vj, m), beta);
  __syncthreads();  // everyone has read red

  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = __fadd_rn(s[r], __fmul_rn(ks[i0 + r], delta));
    o = __fadd_rn(o, __fmul_rn(s[r], qs[i0 + r]));
    const int i = i0 + r;
    if (col_ok && i < g.d_k) __stcs(sh + static_cast<size_t>(i) * g.d_v + j, s[r]);
  }
  red[warp][lane] = o;
  __syncthreads();
  if (warp == 0 && col_ok) {
    o = 0.0f;
#pragma unroll
    for (int w8 = 0; w8 < kDeltaWarps; ++w8) o = __fadd_rn(o, red[w8][lane]);
    ws.o[static_cast<size_t>(n) * g.value_dim + static_cast<size_t>(h) * g.d_v + j] = o;
  }
}

__global__ void __launch_bounds__(32)
    gdn_norm_kernel(Geo g, const float* __restrict__ ssm_norm, GdnDecodeInputs in, Ws ws, float* __restrict__ out) {
  const int h = static_cast<int>(blockIdx.x);
  const int n = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x);
  const size_t off = static_cast<size_t>(n) * g.value_dim + static_cast<size_t>(h) * g.d_v;
  const float* o = ws.o + off;
  const float ss = warp_sum_squares(o, g.d_v, lane);
  const float mean = __fdiv_rn(ss, static_cast<float>(g.d_v));
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, g.eps)));
  const float* z;
  if (g.proj == 2) {  // z_g of the legacy qkvz row: V-heads g·r … g·r + r − 1 of K-group g
    const int zi = h * g.d_v;
    const int rdv = g.r * g.d_v;
    z = in.qkv + static_cast<size_t>(n) * g.qkv_stride + (zi / rdv) * g.group + 2 * g.d_k + rdv + zi % rdv;
  } else {
    z = in.z + off;
  }
  for (int e = lane; e < g.d_v; e += 32) {
    out[off + e] = __fmul_rn(__fmul_rn(__fmul_rn(o[e], scale), ssm_norm[e]), silu_rn(z[e]));
  }
}

template <int R>
void launch_delta(const Geo& g, const GdnSlot* slots, const Ws& ws, int n_seq, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((g.d_v + 31) / 32), static_cast<unsigned>(g.n_v_heads),
                  static_cast<unsigned>(n_seq));
  gdn_delta_kernel<R><<<grid, kDeltaThreads, 0, stream>>>(g, slots, ws);
}

Status invalid(const std::string& what) { return make_error(ErrorCode::kInvalidArgument, "gdn_decode: " + what); }

}  // namespace

size_t gdn_decode_workspace_bytes(const ref::GdnDims& dims, int n_seq) {
  if (n_seq <= 0) return 0;
  const size_t n = static_cast<size_t>(n_seq);
  const size_t floats = 2 * round4(n * static_cast<size_t>(dims.key_dim())) +
                        2 * round4(n * static_cast<size_t>(dims.value_dim())) +
                        2 * round4(n * static_cast<size_t>(dims.n_v_heads));
  return floats * sizeof(float);
}

Status gdn_decode(const ref::GdnDims& dims, ref::GdnProjection projection, const GdnDecodeWeights& w,
                  const GdnDecodeInputs& in, const GdnSlot* slots, int n_seq, float* out, void* workspace,
                  cudaStream_t stream) {
  KESTREL_TRY(dims.validate());
  if (dims.d_k > kGdnMaxDk) {
    return invalid("d_k " + std::to_string(dims.d_k) + " exceeds " + std::to_string(kGdnMaxDk));
  }
  if (dims.conv_kernel < 1) return invalid("conv_kernel " + std::to_string(dims.conv_kernel) + " must be >= 1");
  if (n_seq < 0 || n_seq > 65535) return invalid("n_seq " + std::to_string(n_seq) + " outside [0, 65535]");
  if (n_seq == 0) return ok_status();
  if (w.conv1d == nullptr || w.dt_bias == nullptr || w.ssm_a == nullptr || w.ssm_norm == nullptr) {
    return invalid("a layer weight (conv1d, dt_bias, ssm_a, ssm_norm) is null");
  }
  if (in.qkv == nullptr) return invalid("inputs.qkv is null");
  switch (projection) {
    case ref::GdnProjection::kQkvGateBetaAlpha:
      if (in.z == nullptr || in.b == nullptr || in.a == nullptr) return invalid("inputs z, b or a is null");
      break;
    case ref::GdnProjection::kQkvGateBa:
      if (in.z == nullptr || in.ba == nullptr) return invalid("inputs z or ba is null");
      break;
    case ref::GdnProjection::kSsmInBa:
      if (in.ba == nullptr) return invalid("inputs.ba is null");
      break;
  }
  if (slots == nullptr || out == nullptr || workspace == nullptr) return invalid("slots, out or workspace is null");
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) return invalid("workspace is not 16-byte aligned");

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
  g.qkv_stride = g.proj == 2 ? g.conv_dim + g.value_dim : g.conv_dim;
  g.group = 2 * g.d_k + 2 * g.r * g.d_v;
  g.tiled = dims.mapping == HeadMapping::kTiled;
  g.eps = dims.eps;
  g.q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dims.d_k)));
  const Ws ws = carve(dims, n_seq, workspace);

  gdn_prep_kernel<<<dim3(static_cast<unsigned>(g.n_k_heads), static_cast<unsigned>(n_seq)), kPrepThreads, 0, stream>>>(
      g, w, in, slots, ws);
  KESTREL_CUDA_TRY(cudaGetLastError());
  const int rows = (g.d_k + kDeltaWarps - 1) / kDeltaWarps;
  if (rows <= 4) {
    launch_delta<4>(g, slots, ws, n_seq, stream);
  } else if (rows <= 8) {
    launch_delta<8>(g, slots, ws, n_seq, stream);
  } else if (rows <= 16) {
    launch_delta<16>(g, slots, ws, n_seq, stream);
  } else {
    launch_delta<32>(g, slots, ws, n_seq, stream);
  }
  KESTREL_CUDA_TRY(cudaGetLastError());
  gdn_norm_kernel<<<dim3(static_cast<unsigned>(g.n_v_heads), static_cast<unsigned>(n_seq)), 32, 0, stream>>>(
      g, w.ssm_norm, in, ws, out);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
