// gdn_runs (see gdn_runs.h): the per-V-head decode kernel's block (gdn_decode.cu, gdn_head_kernel) looped over the
// tokens of a run. Per token the block does what gdn_head_kernel does for one, in the same order and with the same
// instructions (conv from the history in registers, the L2 norms' per-warp partials summed in warp order, the delta
// rule in FMAs with column partials of 8 rows summed in warp order, the gated norm); between tokens S_h stays in
// registers and each channel's conv history slides in registers (ConvTaps::push). A sixth barrier per token closes
// the reads of the shared buffers before the next token's prologue rewrites them.
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gdn_common.cuh"
#include "gpu/kernels/gdn_runs.h"

namespace kestrel::gpu {
namespace {

using namespace gdn_detail;  // NOLINT(google-build-using-namespace): the kernels' shared helpers

template <bool kFull>
__global__ void __launch_bounds__(kHeadThreads, 1)
    gdn_runs_kernel(Geo g, GdnDecodeWeights w, GdnDecodeInputs in, const GdnSlot* __restrict__ slots, GdnRunTable runs,
                    unsigned* __restrict__ readers, float* __restrict__ out) {
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
  const int h = static_cast<int>(blockIdx.x);
  const int run = static_cast<int>(blockIdx.y);
  const int len = runs.len[run];
  if (len <= 0) return;  // an unused entry: the whole block leaves
  const int32_t* order = runs.order + runs.start[run];
  const int kh = k_head_of(g, h);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const GdnSlot slot = slots[order[0]];
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
  int ch = -1;
  if (part < 2 && e < g.d_k) ch = (part == 1 ? g.key_dim : 0) + kh * g.d_k + e;
  if (part == 2 && e < g.d_v) ch = 2 * g.key_dim + h * g.d_v + e;
  ConvTaps taps;
  if (ch >= 0) taps.load(g, w.conv1d, slot.conv, ch);
  if (part == 3 && e < g.d_v) nrm[e] = w.ssm_norm[e];
  __syncthreads();  // every history read of this block is done
  if (tid == 0) {
    __threadfence();
    unsigned* counter = readers + static_cast<size_t>(run) * g.n_k_heads + kh;
    last_reader = atomicAdd(counter, 1u) == static_cast<unsigned>(g.r - 1);
    if (last_reader) *counter = 0u;  // every reader has counted: ready for the next call
  }

  for (int t = 0; t < len; ++t) {
    const int n = order[t];
    const float* row = in.qkv + static_cast<size_t>(n) * g.qkv_stride;
    float sq = 0.0f;
    if (part < 2) {
      float u = 0.0f;
      if (ch >= 0) {
        const float x = row[qkv_index(g, ch)];
        u = taps.conv(g, x);
        taps.push(g, x);
      }
      (part == 0 ? qs : ks)[e] = u;
      sq = __fmul_rn(u, u);
    } else if (part == 2) {
      float u = 0.0f;
      if (ch >= 0) {
        const float x = row[qkv_index(g, ch)];
        u = taps.conv(g, x);
        taps.push(g, x);
      }
      vs[e] = u;
    } else {
      if (e < g.d_v) {
        zs[e] = silu_rn(g.proj == 2 ? row[z_index(g, h, e)]
                                    : in.z[static_cast<size_t>(n) * g.z_stride + static_cast<size_t>(h) * g.d_v + e]);
      }
      if (e == 0) head_gates(g, w, in, n, h, gates);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sq = __fadd_rn(sq, __shfl_xor_sync(kFullMask, sq, off));
    if (lane == 0 && part < 2) sq_part[part][warp % (kHeadMaxD / 32)] = sq;
    __syncthreads();  // 1: prologue done

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
    __syncthreads();  // 6: the next token's prologue rewrites what was read since barrier 5
  }

#pragma unroll
  for (int r = 0; r < kHeadRows; ++r) {
#pragma unroll
    for (int c = 0; c < kHeadCols; ++c) {
      if (kFull || (r < rows && lane + 32 * c < g.d_v)) __stcs(s_slice + r * dv + 32 * c, s[r][c]);
    }
  }
  // The block's own v channels' history, and the K-head's q/k history by the last of its readers to count (every
  // reader read it before counting).
  if (part == 2 && ch >= 0) taps.store(g, slot.conv, ch);
  if (last_reader && part < 2 && ch >= 0) {
    __threadfence();
    taps.store(g, slot.conv, ch);
  }
}

Status invalid(const std::string& what) { return make_error(ErrorCode::kInvalidArgument, "gdn_runs: " + what); }

size_t round4(size_t n) { return (n + 3) / 4 * 4; }

}  // namespace

bool gdn_runs_supported(const ref::GdnDims& dims, const GdnDecodeTuning& tuning) {
  if (!dims.validate() || dims.conv_kernel < 1 || dims.conv_kernel > kConvTapsAhead) return false;
  const Expected<GdnKernel> k = gdn_decode_kernel(dims, tuning);
  return k && *k == GdnKernel::kPerHead;
}

size_t gdn_runs_workspace_bytes(const ref::GdnDims& dims, int n_entries) {
  if (n_entries <= 0) return 0;
  return round4(static_cast<size_t>(n_entries) * static_cast<size_t>(dims.n_k_heads)) * sizeof(unsigned);
}

Status gdn_runs(const ref::GdnDims& dims, ref::GdnProjection projection, const GdnDecodeWeights& w,
                const GdnDecodeInputs& in, const GdnSlot* slots, const GdnRunTable& runs, int n_entries, float* out,
                void* workspace, cudaStream_t stream, const GdnDecodeTuning& tuning) {
  if (!gdn_runs_supported(dims, tuning)) {
    return make_error(ErrorCode::kUnsupported,
                      "gdn_runs: these GDN heads (dk " + std::to_string(dims.d_k) + ", dv " + std::to_string(dims.d_v) +
                          ", conv kernel " + std::to_string(dims.conv_kernel) +
                          ") are not on the per-V-head kernel; run a token per gdn_decode call");
  }
  if (n_entries < 1 || n_entries > 65535)
    return invalid("n_entries " + std::to_string(n_entries) + " outside [1, 65535]");
  if (const std::string m = missing_weights_or_inputs(w, in, projection); !m.empty()) return invalid(m);
  if (slots == nullptr || out == nullptr || workspace == nullptr) return invalid("slots, out or workspace is null");
  if (runs.start == nullptr || runs.len == nullptr || runs.order == nullptr) return invalid("a run table is null");
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) return invalid("workspace is not 16-byte aligned");
  const Geo g = make_geo(dims, projection, in.row_stride);
  const dim3 grid(static_cast<unsigned>(g.n_v_heads), static_cast<unsigned>(n_entries));
  if (g.d_k == kHeadMaxD && g.d_v == kHeadMaxD) {
    gdn_runs_kernel<true>
        <<<grid, kHeadThreads, 0, stream>>>(g, w, in, slots, runs, static_cast<unsigned*>(workspace), out);
  } else {
    gdn_runs_kernel<false>
        <<<grid, kHeadThreads, 0, stream>>>(g, w, in, slots, runs, static_cast<unsigned*>(workspace), out);
  }
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
