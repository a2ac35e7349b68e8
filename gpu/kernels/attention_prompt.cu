// attention_prompt (see attention_prompt.h): one block per (kv head, row tile) over shared K/V tiles.
#include <cmath>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/attention_common.cuh"
#include "gpu/kernels/attention_prompt.h"
#include "gpu/kernels/block_reduce.cuh"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/smem_optin.cuh"

namespace kestrel::gpu {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;        // positions a tile: a lane each in the softmax
constexpr int kMaxQueries = 32;  // query vectors a block: rows of the tile × the group's heads

// Rows a block takes for a group of G query heads.
__host__ __device__ inline int rows_per_block(int group) { return group >= kMaxQueries ? 1 : kMaxQueries / group; }

// K tile rows are hd + 4 floats apart: 16-byte aligned for float4 loads, and the 8 rows a quarter-warp reads at one
// offset fall in 8 different groups of 4 banks.
__host__ __device__ inline int k_stride(int hd) { return hd + 4; }

size_t smem_floats(int hd, int nq) {
  // q [nq][hd], K tile [kTile][hd + 4], V tile [kTile][hd], probabilities [nq][kTile], max / sum / correction [nq].
  return static_cast<size_t>(nq) * hd + static_cast<size_t>(kTile) * k_stride(hd) + static_cast<size_t>(kTile) * hd +
         static_cast<size_t>(nq) * kTile + 3 * static_cast<size_t>(nq);
}

// Positions [p0, p0 + n) of one kv head's K and V rows (kbase, vbase: the layer's K or V page-0 base plus the head's
// j · hd) into the shared tiles kt (rows ks floats apart) and vt (hd apart), float4 by float4; rows [n, kTile) are
// zeroed. A thread copies up to kTile · 256 / 4 / kThreads = 8 float4s of each, in rounds of kStagePer of each with
// all of a round's loads issued before its stores: two memory round trips a tile rather than one per load, in the
// registers that leave two blocks an SM. Whole block calls.
constexpr int kStagePer = 4;
constexpr int kStageRounds = kTile * 256 / 4 / kThreads / kStagePer;

__device__ __forceinline__ void stage_kv(const float* __restrict__ kbase, const float* __restrict__ vbase,
                                         const KvPageTable& table, const int32_t* __restrict__ pages, int p0, int n,
                                         int hd, int ks, float* kt, float* vt) {
  const int per_row = hd / 4;
  const int total = kTile * per_row;
#pragma unroll 1
  for (int round = 0; round < kStageRounds; ++round) {
    const int e0 = static_cast<int>(threadIdx.x) + round * kStagePer * kThreads;
    if (e0 >= total) break;
    float4 kv[kStagePer], vv[kStagePer];
#pragma unroll
    for (int u = 0; u < kStagePer; ++u) {
      const int e = e0 + u * kThreads;
      kv[u] = vv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int t = e / per_row, i = (e - t * per_row) * 4;
      if (e < total && t < n) {
        const int64_t row = attn_dev::paged_row(table, pages, p0 + t);
        kv[u] = *reinterpret_cast<const float4*>(kbase + row + i);
        vv[u] = *reinterpret_cast<const float4*>(vbase + row + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kStagePer; ++u) {
      const int e = e0 + u * kThreads;
      if (e >= total) break;
      const int t = e / per_row, i = (e - t * per_row) * 4;
      *reinterpret_cast<float4*>(kt + t * ks + i) = kv[u];
      *reinterpret_cast<float4*>(vt + t * hd + i) = vv[u];
    }
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    attend_prompt_kernel(AttnDecodeDims d, KvPageTable cache, const float* __restrict__ qg, int64_t qg_stride,
                         const float* __restrict__ q_norm, const float* __restrict__ inv_freq, int slot, int pos0,
                         int n_rows, float scale, float* __restrict__ out, uint8_t* __restrict__ xprep,
                         imma_prep::XLayout lay) {
  extern __shared__ float4 smem4[];  // 16-byte aligned: every piece below starts at a multiple of 4 floats
  float* smem = reinterpret_cast<float*>(smem4);
  const int j = static_cast<int>(blockIdx.x);
  const int hd = d.head_dim, G = d.n_head / d.n_head_kv;
  const int qr = rows_per_block(G);
  const int r0 = static_cast<int>(blockIdx.y) * qr;
  const int rows = min(qr, n_rows - r0);
  const int nq = rows * G;  // query q = row · G + g
  const int ks = k_stride(hd);
  float* q = smem;               // [nq][hd]
  float* kt = q + nq * hd;       // [kTile][ks]
  float* vt = kt + kTile * ks;   // [kTile][hd]
  float* pr = vt + kTile * hd;   // [nq][kTile]
  float* m_s = pr + nq * kTile;  // [nq]
  float* l_s = m_s + nq;         // [nq]
  float* corr_s = l_s + nq;      // [nq]
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;

  // The queries, normed and roped at their rows' positions (the V tile is the warps' scratch until the first tile).
  for (int e = warp; e < nq; e += kWarps) {
    const int row = e / G, g = e - row * G;
    const float* src =
        qg + static_cast<size_t>(r0 + row) * static_cast<size_t>(qg_stride) + static_cast<size_t>(j * G + g) * 2 * hd;
    attn_dev::norm_rope_head_warp(src, q_norm, inv_freq, hd, d.n_rot, d.eps, static_cast<float>(pos0 + r0 + row),
                                  vt + warp * hd, q + e * hd);
  }
  for (int e = tid; e < nq; e += kThreads) m_s[e] = -INFINITY, l_s[e] = 0.0f;
  // The accumulators: thread (column i, query group qg) holds queries qg, qg + qstep, … (at most kMaxQueries).
  const int qstep = kThreads / hd;  // hd divides 256
  const int col = tid % hd, qg0 = tid / hd;
  float acc[kMaxQueries];
#pragma unroll
  for (int k = 0; k < kMaxQueries; ++k) acc[k] = 0.0f;
  __syncthreads();

  const float* kbase = cache.k + static_cast<size_t>(j) * hd;
  const float* vbase = cache.v + static_cast<size_t>(j) * hd;
  const int32_t* pages = cache.pages + static_cast<int64_t>(slot) * cache.max_pages;
  const int last = pos0 + r0 + rows - 1;  // the tile's last row's position: the positions it attends end there
  // Scores: thread (query sq, positions sp, sp + 8, sp + 16, sp + 24).
  const int sq = tid >> 3, sp = tid & 7;
  for (int p0 = 0; p0 <= last; p0 += kTile) {
    const int n = min(kTile, last + 1 - p0);
    stage_kv(kbase, vbase, cache, pages, p0, n, hd, ks, kt, vt);
    __syncthreads();
    if (sq < nq) {
      const float* qv = q + sq * hd;
      const int pos = pos0 + r0 + sq / G;
      float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int i = 0; i < hd; i += 4) {
        const float4 x = *reinterpret_cast<const float4*>(qv + i);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float4 k4 = *reinterpret_cast<const float4*>(kt + (sp + 8 * r) * ks + i);
          a[r] = fmaf(x.w, k4.w, fmaf(x.z, k4.z, fmaf(x.y, k4.y, fmaf(x.x, k4.x, a[r]))));
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = sp + 8 * r;
        pr[sq * kTile + t] = t < n && p0 + t <= pos ? a[r] * scale : -INFINITY;
      }
    }
    __syncthreads();
    for (int e = warp; e < nq; e += kWarps) {
      const float s = pr[e * kTile + lane];
      const float m_old = m_s[e];
      const float m_new = fmaxf(m_old, warp_max(s));  // finite: every row attends position 0 in the first tile
      const float x = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float sum = warp_sum(x);
      __syncwarp();
      pr[e * kTile + lane] = x;
      if (lane == 0) {
        const float corr = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        corr_s[e] = corr;
        l_s[e] = l_s[e] * corr + sum;
        m_s[e] = m_new;
      }
    }
    __syncthreads();
    // acc[q] = acc[q] · corr_q, then + p[q][t] V[t][col] for t in order: the 4 V values of a group of positions are
    // loaded once for every query the thread holds (probabilities past n are 0 and the V rows there zeros).
#pragma unroll
    for (int k = 0; k < kMaxQueries; ++k) {
      const int e = qg0 + k * qstep;
      if (e < nq) acc[k] *= corr_s[e];
    }
    for (int t = 0; t < n; t += 4) {
      const float v0 = vt[t * hd + col], v1 = vt[(t + 1) * hd + col];
      const float v2 = vt[(t + 2) * hd + col], v3 = vt[(t + 3) * hd + col];
#pragma unroll
      for (int k = 0; k < kMaxQueries; ++k) {
        const int e = qg0 + k * qstep;
        if (e >= nq) break;
        const float4 p4 = *reinterpret_cast<const float4*>(pr + e * kTile + t);
        acc[k] = fmaf(p4.w, v3, fmaf(p4.z, v2, fmaf(p4.y, v1, fmaf(p4.x, v0, acc[k]))));
      }
    }
    __syncthreads();
  }

  // out = acc / l ⊙ sigmoid(gate).
#pragma unroll
  for (int k = 0; k < kMaxQueries; ++k) {
    const int e = qg0 + k * qstep;
    if (e >= nq) break;
    const int row = e / G, g = e - row * G;
    const int h = j * G + g;
    const size_t r = static_cast<size_t>(r0 + row);
    const float gate = qg[r * static_cast<size_t>(qg_stride) + static_cast<size_t>(h) * 2 * hd + hd + col];
    out[r * d.n_head * hd + static_cast<size_t>(h) * hd + col] = (acc[k] / l_s[e]) * attn_dev::sigmoid_f(gate);
  }
  if (xprep == nullptr) return;
  __syncthreads();  // the block's rows of its heads are written (read back through L2 below)
  const int per_head = hd / imma_prep::kGroupElems;
  for (int e = warp; e < nq * per_head; e += kWarps) {
    const int qe = e / per_head, grp = e - qe * per_head;
    const int row = qe / G, g = qe - row * G;
    imma_prep::prepare_group(imma_prep::L2Rows{out}, d.n_head * hd, lay, xprep, r0 + row, (j * G + g) * per_head + grp,
                             lane);
  }
}

}  // namespace

bool attention_prompt_supports(const AttnDecodeDims& d) {
  const int hd = d.head_dim;
  return (hd == 32 || hd == 64 || hd == 128 || hd == 256) && d.n_head_kv >= 1 && d.n_head % d.n_head_kv == 0 &&
         d.n_head / d.n_head_kv <= kMaxQueries && d.n_rot >= 0 && d.n_rot <= hd;
}

Status attention_prompt(const AttnDecodeDims& d, const KvPageTable& cache, const AttnDecodeArgs& a, int n_rows,
                        int32_t slot, int32_t pos0, cudaStream_t stream) {
  const auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "attention_prompt: " + what);
  };
  if (!attention_prompt_supports(d)) {
    return make_error(ErrorCode::kUnsupported, "attention_prompt: head_dim " + std::to_string(d.head_dim) + ", " +
                                                   std::to_string(d.n_head) + " heads over " +
                                                   std::to_string(d.n_head_kv) + " kv heads");
  }
  if (n_rows < 1 || slot < 0 || pos0 < 0 || static_cast<int64_t>(pos0) + n_rows > cache.capacity() || a.qg == nullptr ||
      a.q_norm == nullptr || a.out == nullptr || (d.n_rot > 0 && a.rope_inv_freq == nullptr) || cache.k == nullptr ||
      cache.v == nullptr || cache.pages == nullptr || cache.head_dim != d.head_dim || cache.n_head_kv != d.n_head_kv) {
    return bad(std::to_string(n_rows) + " rows from position " + std::to_string(pos0) + " of slot " +
               std::to_string(slot) + ", a null argument or a cache of other dims");
  }
  const int64_t qg_packed = int64_t{d.n_head} * 2 * d.head_dim;
  const int64_t qg_stride = a.qg_stride == 0 ? qg_packed : a.qg_stride;
  if (qg_stride < qg_packed) return bad("q|gate rows narrower than " + std::to_string(qg_packed));
  if (a.out_prepared != nullptr &&
      (!attention_prepares_out(d) || reinterpret_cast<uintptr_t>(a.out_prepared) % 16 != 0 ||
       reinterpret_cast<uintptr_t>(a.out) % 16 != 0)) {
    return bad("out_prepared needs head_dim a multiple of 256 and 16-byte aligned out and out_prepared");
  }
  const int group = d.n_head / d.n_head_kv;
  const int qr = rows_per_block(group);
  const size_t smem = smem_floats(d.head_dim, qr * group) * sizeof(float);
  KESTREL_TRY(check_smem<attend_prompt_kernel>(
      smem, [&] { return "attention_prompt: head_dim " + std::to_string(d.head_dim); }));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));  // the reference's
  const dim3 grid(static_cast<unsigned>(d.n_head_kv), static_cast<unsigned>((n_rows + qr - 1) / qr));
  attend_prompt_kernel<<<grid, kThreads, smem, stream>>>(
      d, cache, a.qg, qg_stride, a.q_norm, a.rope_inv_freq, slot, pos0, n_rows, scale, a.out,
      static_cast<uint8_t*>(a.out_prepared), imma_prep::x_layout(int64_t{d.n_head} * d.head_dim));
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
