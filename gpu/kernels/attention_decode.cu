// attention_decode (see attention_decode.h): k/v append kernel, then one block per (head, sequence, chunk of
// positions) with a 4-warp online softmax merged in warp order, then (for sequences of several chunks) a merge of
// the chunk records in chunk order.
#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

#include "gpu/cuda_check.h"
#include "gpu/kernels/attention_decode.h"
#include "gpu/kernels/block_reduce.cuh"

namespace kestrel::gpu {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMaxPerLane = kAttnDecodeMaxHeadDim / 32;

// dst[i] = RoPE(rms_norm(src) · w)[i] for one head of hd values (ref::rms_norm then ref::rope_neox_partial).
// normed: shared f32 [hd] scratch; dst may be global or shared, must not alias src or normed. Whole block calls.
__device__ void norm_rope_head(const float* src, const float* __restrict__ w, const float* __restrict__ inv_freq,
                               int hd, int n_rot, float eps, float pos, float* normed, float* dst, float* scratch) {
  float ss = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) ss += src[i] * src[i];
  ss = block_sum(ss, scratch);
  const float mean = ss / static_cast<float>(hd);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) normed[i] = (src[i] * scale) * w[i];
  __syncthreads();
  const int half = n_rot / 2;
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) {
    if (i >= n_rot) {
      dst[i] = normed[i];
    } else {
      const int p = i < half ? i : i - half;
      const float theta = pos * inv_freq[p];
      const float c = cosf(theta), s = sinf(theta);
      const float a = normed[p], b = normed[p + half];
      // q·cos + rotate_half(q)·sin with rotate_half = [−x2, x1], written without FMA so the rounding is the
      // reference's: x_i' = a·c + (−b)·s, x_{i+half}' = b·c + a·s.
      dst[i] = i < half ? __fadd_rn(__fmul_rn(a, c), __fmul_rn(-b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
  }
}

// grid (n_kv, n_seq): K[pos] = rope(norm(k)), V[pos] = v for kv head blockIdx.x of sequence blockIdx.y.
__global__ void kv_append_kernel(AttnDecodeDims d, KvSlotTable cache, const float* __restrict__ k,
                                 const float* __restrict__ v, const float* __restrict__ k_norm,
                                 const float* __restrict__ inv_freq, const int32_t* __restrict__ slot_ids,
                                 const int32_t* __restrict__ positions) {
  __shared__ float scratch[33];
  __shared__ float normed[kAttnDecodeMaxHeadDim];
  const int j = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int hd = d.head_dim;
  const int slot = slot_ids[b], pos = positions[b];
  const size_t row = (static_cast<size_t>(pos) * d.n_head_kv + static_cast<size_t>(j)) * hd;
  const size_t src = (static_cast<size_t>(b) * d.n_head_kv + static_cast<size_t>(j)) * hd;
  float* kc = cache.k[slot] + row;
  float* vc = cache.v[slot] + row;
  norm_rope_head(k + src, k_norm, inv_freq, hd, d.n_rot, d.eps, static_cast<float>(pos), normed, kc, scratch);
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) vc[i] = v[src + i];
}

// The split of [0, pos] into chunks: as many chunks of `chunk` positions as cover it, at most max_chunks of them,
// each then ceil((pos + 1) / n) positions long. It depends only on the sequence's own position.
__host__ __device__ __forceinline__ int n_chunks_of(int pos, const AttnDecodeDims& d) {
  return min(pos / d.chunk + 1, d.max_chunks);
}
__device__ __forceinline__ int chunk_len_of(int pos, int n_chunks) { return (pos + n_chunks) / n_chunks; }

// Per (head, sequence, chunk) record in the workspace: [0] running max, [1] sum, [2, 2 + hd) unnormalised output.
__device__ __forceinline__ size_t chunk_record(int b, int h, int c, int n_head, int max_chunks, int hd) {
  return ((static_cast<size_t>(b) * n_head + static_cast<size_t>(h)) * max_chunks + static_cast<size_t>(c)) *
         (static_cast<size_t>(hd) + 2);
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// grid (n_head, n_seq, max_chunks): softmax(q·K/sqrt(hd)) V over chunk blockIdx.z of head h of sequence b; a
// sequence of one chunk is finished here (out = attn ⊙ sigmoid(gate)), longer ones leave a workspace record.
__global__ void __launch_bounds__(kThreads)
    attend_kernel(AttnDecodeDims d, KvSlotTable cache, const float* __restrict__ qg, const float* __restrict__ q_norm,
                  const float* __restrict__ inv_freq, const int32_t* __restrict__ slot_ids,
                  const int32_t* __restrict__ positions, float scale, int max_chunks, float* __restrict__ ws,
                  float* __restrict__ out) {
  __shared__ float scratch[33];
  __shared__ float normed[kAttnDecodeMaxHeadDim];
  __shared__ float q[kAttnDecodeMaxHeadDim];
  __shared__ float acc_w[kWarps][kAttnDecodeMaxHeadDim];
  __shared__ float m_w[kWarps], l_w[kWarps];
  const int h = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.z);
  const int hd = d.head_dim;
  const int slot = slot_ids[b], pos = positions[b];
  const int n_chunks = n_chunks_of(pos, d);
  if (c >= n_chunks) return;  // whole block: this sequence is shorter than the batch's longest
  const float* qrow = qg + static_cast<size_t>(b) * d.n_head * 2 * hd + static_cast<size_t>(h) * 2 * hd;
  norm_rope_head(qrow, q_norm, inv_freq, hd, d.n_rot, d.eps, static_cast<float>(pos), normed, q, scratch);
  __syncthreads();

  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int kvh = h / (d.n_head / d.n_head_kv);
  const int n_per_lane = (hd + 31) / 32;
  float qr[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int i = lane + 32 * t;
    qr[t] = (t < n_per_lane && i < hd) ? q[i] : 0.0f;
    acc[t] = 0.0f;
  }
  const float* kbase = cache.k[slot] + static_cast<size_t>(kvh) * hd;
  const float* vbase = cache.v[slot] + static_cast<size_t>(kvh) * hd;
  const size_t pos_stride = static_cast<size_t>(d.n_head_kv) * hd;
  const int len = chunk_len_of(pos, n_chunks);
  const int p_begin = c * len;
  const int p_end = min(pos + 1, p_begin + len);
  float m = -INFINITY, l = 0.0f;
  for (int p = p_begin + warp; p < p_end; p += kWarps) {
    const float* kp = kbase + static_cast<size_t>(p) * pos_stride;
    float dot = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int i = lane + 32 * t;
      if (t < n_per_lane && i < hd) dot += qr[t] * kp[i];
    }
    const float s = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float e = expf(s - m_new);
    l = l * corr + e;
    const float* vp = vbase + static_cast<size_t>(p) * pos_stride;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int i = lane + 32 * t;
      if (t < n_per_lane && i < hd) acc[t] = acc[t] * corr + e * vp[i];
    }
    m = m_new;
  }
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int i = lane + 32 * t;
    if (t < n_per_lane && i < hd) acc_w[warp][i] = acc[t];
  }
  if (lane == 0) {
    m_w[warp] = m;
    l_w[warp] = l;
  }
  __syncthreads();
  float m_all = m_w[0];
  for (int w = 1; w < kWarps; ++w) m_all = fmaxf(m_all, m_w[w]);
  float f[kWarps];
  float l_all = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    f[w] = l_w[w] > 0.0f ? expf(m_w[w] - m_all) : 0.0f;  // a warp that saw no position contributes nothing
    l_all += l_w[w] * f[w];
  }
  if (n_chunks == 1) {
    const float* gate = qrow + hd;
    float* orow = out + static_cast<size_t>(b) * d.n_head * hd + static_cast<size_t>(h) * hd;
    for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) {
      float a = 0.0f;
      for (int w = 0; w < kWarps; ++w) a += acc_w[w][i] * f[w];
      orow[i] = (a / l_all) * sigmoid_f(gate[i]);
    }
  } else {
    float* rec = ws + chunk_record(b, h, c, d.n_head, max_chunks, hd);
    if (threadIdx.x == 0) {
      rec[0] = m_all;
      rec[1] = l_all;
    }
    for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) {
      float a = 0.0f;
      for (int w = 0; w < kWarps; ++w) a += acc_w[w][i] * f[w];
      rec[2 + i] = a;
    }
  }
}

// grid (n_head, n_seq): merges the chunk records of sequences with more than one chunk, in chunk order.
__global__ void merge_chunks_kernel(AttnDecodeDims d, const float* __restrict__ qg,
                                    const int32_t* __restrict__ positions, int max_chunks, const float* __restrict__ ws,
                                    float* __restrict__ out) {
  const int h = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int hd = d.head_dim;
  const int n_chunks = n_chunks_of(positions[b], d);
  if (n_chunks == 1) return;  // finished by attend_kernel
  const float* first = ws + chunk_record(b, h, 0, d.n_head, max_chunks, hd);
  const size_t rec_stride = static_cast<size_t>(hd) + 2;
  float m_all = first[0];
  for (int c = 1; c < n_chunks; ++c) m_all = fmaxf(m_all, first[c * rec_stride]);
  float l_all = 0.0f;
  for (int c = 0; c < n_chunks; ++c) l_all += first[c * rec_stride + 1] * expf(first[c * rec_stride] - m_all);
  const float* gate = qg + static_cast<size_t>(b) * d.n_head * 2 * hd + static_cast<size_t>(h) * 2 * hd + hd;
  float* orow = out + static_cast<size_t>(b) * d.n_head * hd + static_cast<size_t>(h) * hd;
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) {
    float a = 0.0f;
    for (int c = 0; c < n_chunks; ++c) a += first[c * rec_stride + 2 + i] * expf(first[c * rec_stride] - m_all);
    orow[i] = (a / l_all) * sigmoid_f(gate[i]);
  }
}

}  // namespace

size_t attention_decode_workspace_bytes(const AttnDecodeDims& d, int n_seq, int n_ctx) {
  if (d.chunk < 1 || d.max_chunks < 1 || n_seq < 1 || n_ctx < 1 || d.n_head < 1 || d.head_dim < 1) return 0;
  const size_t max_chunks = static_cast<size_t>(n_chunks_of(n_ctx - 1, d));
  return static_cast<size_t>(n_seq) * static_cast<size_t>(d.n_head) * max_chunks *
         (static_cast<size_t>(d.head_dim) + 2) * sizeof(float);
}

Status attention_decode(const AttnDecodeDims& d, const KvSlotTable& cache, int n_slots, const AttnDecodeArgs& a,
                        std::span<const int32_t> slot_ids_host, std::span<const int32_t> positions_host,
                        cudaStream_t stream) {
  const auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "attention_decode: " + what);
  };
  if (d.n_head <= 0 || d.n_head_kv <= 0 || d.n_head % d.n_head_kv != 0) {
    return bad("n_head " + std::to_string(d.n_head) + " must be a positive multiple of n_head_kv " +
               std::to_string(d.n_head_kv));
  }
  if (d.head_dim < 1 || d.head_dim > kAttnDecodeMaxHeadDim) {
    return bad("head_dim " + std::to_string(d.head_dim) + " outside 1.." + std::to_string(kAttnDecodeMaxHeadDim));
  }
  if (d.n_rot < 0 || d.n_rot % 2 != 0 || d.n_rot > d.head_dim) {
    return bad("n_rot " + std::to_string(d.n_rot) + " must be even and at most head_dim");
  }
  if (d.chunk < 1 || d.max_chunks < 1 || d.max_chunks > 65535) {
    return bad("chunk " + std::to_string(d.chunk) + " must be at least 1 position and max_chunks (" +
               std::to_string(d.max_chunks) + ") in 1..65535");
  }
  if (cache.k == nullptr || cache.v == nullptr || cache.n_head_kv != d.n_head_kv || cache.head_dim != d.head_dim) {
    return bad("the KV cache table (" + std::to_string(cache.n_head_kv) + " kv heads of " +
               std::to_string(cache.head_dim) + ") does not match the layer (" + std::to_string(d.n_head_kv) + " of " +
               std::to_string(d.head_dim) + ")");
  }
  if (slot_ids_host.size() != positions_host.size()) {
    return bad(std::to_string(slot_ids_host.size()) + " slot ids but " + std::to_string(positions_host.size()) +
               " positions");
  }
  const size_t n_seq = slot_ids_host.size();
  if (n_seq == 0) return ok_status();
  if (n_seq > 65535) return bad("more than 65535 sequences in one call");
  if (a.qg == nullptr || a.k == nullptr || a.v == nullptr || a.q_norm == nullptr || a.k_norm == nullptr ||
      a.slot_ids == nullptr || a.positions == nullptr || a.out == nullptr ||
      (d.n_rot > 0 && a.rope_inv_freq == nullptr)) {
    return bad("null pointer among the arguments");
  }
  std::unordered_set<int32_t> seen;
  for (size_t b = 0; b < n_seq; ++b) {
    const int32_t s = slot_ids_host[b], p = positions_host[b];
    if (s < 0 || s >= n_slots) {
      return make_error(ErrorCode::kOutOfRange, "attention_decode: sequence " + std::to_string(b) + " has slot " +
                                                    std::to_string(s) + " outside 0.." + std::to_string(n_slots - 1));
    }
    if (!seen.insert(s).second) {
      return bad("slot " + std::to_string(s) + " appears twice in one batch (sequence " + std::to_string(b) + ")");
    }
    if (p < 0 || p >= cache.n_ctx) {
      return make_error(ErrorCode::kOutOfRange, "attention_decode: sequence " + std::to_string(b) + " (slot " +
                                                    std::to_string(s) + ") is at position " + std::to_string(p) +
                                                    ", the cache holds " + std::to_string(cache.n_ctx) +
                                                    " tokens (raise the context size)");
    }
  }
  int max_pos = 0;
  for (int32_t p : positions_host) max_pos = std::max(max_pos, static_cast<int>(p));
  return attention_decode_device(d, cache, a, static_cast<int>(n_seq), max_pos, stream);
}

Status attention_decode_device(const AttnDecodeDims& d, const KvSlotTable& cache, const AttnDecodeArgs& a, int n_seq,
                               int max_position, cudaStream_t stream) {
  const auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "attention_decode: " + what);
  };
  if (n_seq < 1 || n_seq > 65535 || max_position < 0 || d.chunk < 1 || d.max_chunks < 1 || d.max_chunks > 65535) {
    return bad(std::to_string(n_seq) + " sequences, position bound " + std::to_string(max_position) + ", chunk " +
               std::to_string(d.chunk) + ", max_chunks " + std::to_string(d.max_chunks));
  }
  const int max_pos = max_position;
  const int max_chunks = n_chunks_of(max_pos, d);
  if (max_chunks > 1) {
    const size_t need = static_cast<size_t>(n_seq) * static_cast<size_t>(d.n_head) * static_cast<size_t>(max_chunks) *
                        (static_cast<size_t>(d.head_dim) + 2) * sizeof(float);
    if (a.workspace == nullptr || a.workspace_bytes < need) {
      return bad("position " + std::to_string(max_pos) + " spans " + std::to_string(max_chunks) + " chunks of " +
                 std::to_string(d.chunk) + " and needs a workspace of " + std::to_string(need) + " bytes (given " +
                 std::to_string(a.workspace == nullptr ? 0 : a.workspace_bytes) +
                 "; see attention_decode_workspace_bytes)");
    }
  }
  // The reference's scale: (float)(1 / sqrt((double)hd)).
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  const unsigned seqs = static_cast<unsigned>(n_seq);
  kv_append_kernel<<<dim3(static_cast<unsigned>(d.n_head_kv), seqs), kThreads, 0, stream>>>(
      d, cache, a.k, a.v, a.k_norm, a.rope_inv_freq, a.slot_ids, a.positions);
  KESTREL_CUDA_TRY(cudaGetLastError());
  attend_kernel<<<dim3(static_cast<unsigned>(d.n_head), seqs, static_cast<unsigned>(max_chunks)), kThreads, 0,
                  stream>>>(d, cache, a.qg, a.q_norm, a.rope_inv_freq, a.slot_ids, a.positions, scale, max_chunks,
                            a.workspace, a.out);
  KESTREL_CUDA_TRY(cudaGetLastError());
  if (max_chunks > 1) {
    merge_chunks_kernel<<<dim3(static_cast<unsigned>(d.n_head), seqs), kThreads, 0, stream>>>(
        d, a.qg, a.positions, max_chunks, a.workspace, a.out);
    KESTREL_CUDA_TRY(cudaGetLastError());
  }
  return ok_status();
}

}  // namespace kestrel::gpu
