// attention_common.cuh: device helpers of the attention kernels (attention_decode.cu, attention_prompt.cu): the
// q/k RMSNorm + partial NeoX RoPE of one head, paged cache rows and the staging of K/V tiles. Device code only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels/block_reduce.cuh"
#include "gpu/memory/state_slots.h"  // KvPageTable

namespace kestrel::gpu::attn_dev {

// Element i of the partial NeoX RoPE of a normed head at position pos (pairs (i, i + n_rot/2); dims from n_rot on
// pass through): q·cos + rotate_half(q)·sin with rotate_half = [−x2, x1], written without FMA so the rounding is the
// reference's: x_i' = a·c + (−b)·s, x_{i+half}' = b·c + a·s.
__device__ __forceinline__ float rope_element(const float* normed, const float* __restrict__ inv_freq, int i, int n_rot,
                                              float pos) {
  if (i >= n_rot) return normed[i];
  const int half = n_rot / 2;
  const int p = i < half ? i : i - half;
  const float theta = pos * inv_freq[p];
  const float c = cosf(theta), s = sinf(theta);
  const float a = normed[p], b = normed[p + half];
  return i < half ? __fadd_rn(__fmul_rn(a, c), __fmul_rn(-b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// dst[i] = RoPE(rms_norm(src) · w)[i] for one head of hd values (ref::rms_norm then ref::rope_neox_partial).
// normed: shared f32 [hd] scratch; dst may be global or shared, must not alias src or normed. Whole block calls.
__device__ inline void norm_rope_head(const float* src, const float* __restrict__ w, const float* __restrict__ inv_freq,
                                      int hd, int n_rot, float eps, float pos, float* normed, float* dst,
                                      float* scratch) {
  float ss = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) ss += src[i] * src[i];
  ss = block_sum(ss, scratch);
  const float mean = ss / static_cast<float>(hd);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) normed[i] = (src[i] * scale) * w[i];
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) {
    dst[i] = rope_element(normed, inv_freq, i, n_rot, pos);
  }
}

// The same as norm_rope_head for one warp: dst = RoPE(rms_norm(src) · w) with the sum of squares reduced by the
// warp. normed: hd floats of shared scratch private to the warp; dst is shared memory. Whole warp calls.
__device__ inline void norm_rope_head_warp(const float* src, const float* __restrict__ w,
                                           const float* __restrict__ inv_freq, int hd, int n_rot, float eps, float pos,
                                           float* normed, float* dst) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  float ss = 0.0f;
  for (int i = lane; i < hd; i += 32) ss += src[i] * src[i];
  ss = warp_sum(ss);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
  for (int i = lane; i < hd; i += 32) normed[i] = (src[i] * scale) * w[i];
  __syncwarp();
  for (int i = lane; i < hd; i += 32) {
    dst[i] = rope_element(normed, inv_freq, i, n_rot, pos);
  }
  __syncwarp();
}

// Floats from the layer's page-0 base (KvPageTable::k or v) to the row of position p of the slot whose table entries
// start at `pages` (kv head 0; kv head j is j · hd further).
__device__ __forceinline__ int64_t paged_row(const KvPageTable& t, const int32_t* pages, int p) {
  const int shift = __ffs(t.page_size) - 1;  // page_size is a power of two
  const int64_t page = pages[p >> shift];
  return page * t.page_stride + static_cast<int64_t>(p & (t.page_size - 1)) * t.n_head_kv * t.head_dim;
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// Copies positions [p0, p0 + n) of one kv head's rows (base: the layer's K or V page-0 base plus the head's j · hd;
// each position's row found through the slot's table entries `pages`) into a shared tile of rows of hd + 1 floats
// (the pad keeps the score loop, one position per lane, free of bank conflicts). A tile no longer than a page (always
// with the engine's 256-position pages) lies in at most two pages, whose bases are read once; with smaller pages
// every row looks its page up. Either way the same rows land in the tile. Whole block calls.
__device__ __forceinline__ void load_tile(const float* __restrict__ base, const KvPageTable& table,
                                          const int32_t* __restrict__ pages, int p0, int n, int hd, float* tile) {
  const int stride = hd + 1;
  const int shift = __ffs(table.page_size) - 1;
  const int64_t row_floats = static_cast<int64_t>(table.n_head_kv) * hd;
  const bool two_pages = n <= table.page_size;
  const int next = ((p0 >> shift) + 1) << shift;  // the first position of the page after p0's
  const int64_t base0 = two_pages ? pages[p0 >> shift] * table.page_stride : 0;
  const int64_t base1 = two_pages && p0 + n > next ? pages[next >> shift] * table.page_stride : base0;
  const auto row = [&](int p) -> int64_t {
    if (!two_pages) return paged_row(table, pages, p);
    return (p < next ? base0 : base1) + static_cast<int64_t>(p & (table.page_size - 1)) * row_floats;
  };
  if ((hd & 3) == 0) {
    const int per_row = hd / 4;
    for (int e = static_cast<int>(threadIdx.x); e < n * per_row; e += blockDim.x) {
      const int t = e / per_row, i = (e - t * per_row) * 4;
      const float4 v = *reinterpret_cast<const float4*>(base + row(p0 + t) + i);
      float* dst = tile + t * stride + i;
      dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
  } else {
    for (int e = static_cast<int>(threadIdx.x); e < n * hd; e += blockDim.x) {
      const int t = e / hd, i = e - t * hd;
      tile[t * stride + i] = base[row(p0 + t) + i];
    }
  }
}

}  // namespace kestrel::gpu::attn_dev
