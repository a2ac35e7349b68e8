// attention_decode (see attention_decode.h): k/v append kernel, then one block per (kv head, sequence, chunk of
// positions) serving the kv head's whole group of query heads from tiles staged in shared memory, then (for
// sequences of several chunks) a merge of the chunk records in chunk order; every cache row is found through the
// slot's page table. kv_page_publish writes the table entries a pass appends to.
#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

#include "gpu/cuda_check.h"
#include "gpu/kernels/attention_common.cuh"
#include "gpu/kernels/attention_decode.h"
#include "gpu/kernels/block_reduce.cuh"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/smem_optin.cuh"

namespace kestrel::gpu {
namespace {

using attn_dev::load_tile;
using attn_dev::norm_rope_head;
using attn_dev::norm_rope_head_warp;
using attn_dev::paged_row;
using attn_dev::sigmoid_f;

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;

// grid (n_kv, n_seq): K[pos] = rope(norm(k)), V[pos] = v for kv head blockIdx.x of sequence blockIdx.y.
__global__ void kv_append_kernel(AttnDecodeDims d, KvPageTable cache, const float* __restrict__ k,
                                 const float* __restrict__ v, int64_t kv_stride, const float* __restrict__ k_norm,
                                 const float* __restrict__ inv_freq, const int32_t* __restrict__ slot_ids,
                                 const int32_t* __restrict__ positions) {
  __shared__ float scratch[33];
  __shared__ float normed[kAttnDecodeMaxHeadDim];
  const int j = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int hd = d.head_dim;
  const int slot = slot_ids[b], pos = positions[b];
  const int64_t row =
      paged_row(cache, cache.pages + static_cast<int64_t>(slot) * cache.max_pages, pos) + static_cast<int64_t>(j) * hd;
  const size_t src = static_cast<size_t>(b) * static_cast<size_t>(kv_stride) + static_cast<size_t>(j) * hd;
  float* kc = cache.k + row;
  float* vc = cache.v + row;
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

// Positions a GQA block stages per tile: the largest of 32, 16, 8 whose shared memory (attend_smem_floats) stays
// within kAttendSmemTarget, so several blocks share an SM and their tile loads overlap one another's compute.
constexpr size_t kAttendSmemTarget = 64 * 1024;

size_t attend_smem_floats(int group, int hd, int tile) {
  const size_t gh = static_cast<size_t>(group) * static_cast<size_t>(hd);
  // q [G][hd], acc [G][hd], K and V tiles [T][hd + 1], probabilities [G][T], running max / sum / correction [G].
  return 2 * gh + 2 * static_cast<size_t>(tile) * static_cast<size_t>(hd + 1) +
         static_cast<size_t>(group) * static_cast<size_t>(tile) + 3 * static_cast<size_t>(group);
}

int attend_tile_of(int group, int hd) {
  for (int t : {32, 16}) {
    if (attend_smem_floats(group, hd, t) * sizeof(float) <= kAttendSmemTarget) return t;
  }
  return 8;
}

// grid (n_kv, n_seq, max_chunks): the G = n_head / n_kv query heads of kv head blockIdx.x of sequence blockIdx.y over
// chunk blockIdx.z of its positions, so each K and V row of the cache is read once for the whole group. The chunk
// is walked in tiles of `tile` positions staged in shared memory; per tile: scores s[g][t] = q_g · K[t] · scale (one
// thread per (head, position), a fixed-order dot), the online softmax of each head (one warp per head, lane =
// position), then acc[g][i] = acc[g][i] · corr_g + Σ_t p[g][t] V[t][i] (one thread per (head, dim), t in order). A
// sequence of one chunk is finished here (out = acc / l ⊙ sigmoid(gate)); longer ones leave a workspace record per
// head.
__global__ void __launch_bounds__(kThreads)
    attend_kernel(AttnDecodeDims d, KvPageTable cache, const float* __restrict__ qg, int64_t qg_stride,
                  const float* __restrict__ q_norm, const float* __restrict__ inv_freq,
                  const int32_t* __restrict__ slot_ids, const int32_t* __restrict__ positions, float scale,
                  int max_chunks, int tile, float* __restrict__ ws, float* __restrict__ out) {
  extern __shared__ float smem[];
  const int j = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.z);
  const int hd = d.head_dim, G = d.n_head / d.n_head_kv;
  const int slot = slot_ids[b], pos = positions[b];
  const int n_chunks = n_chunks_of(pos, d);
  if (c >= n_chunks) return;  // whole block: this sequence is shorter than the batch's longest
  const int stride = hd + 1;
  float* q = smem;                 // [G][hd]
  float* acc = q + G * hd;         // [G][hd]
  float* kt = acc + G * hd;        // [tile][hd + 1]
  float* vt = kt + tile * stride;  // [tile][hd + 1]
  float* pr = vt + tile * stride;  // [G][tile]
  float* m_s = pr + G * tile;      // [G]
  float* l_s = m_s + G;            // [G]
  float* corr_s = l_s + G;         // [G]

  const float* qrow0 =
      qg + static_cast<size_t>(b) * static_cast<size_t>(qg_stride) + static_cast<size_t>(j) * G * 2 * hd;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  for (int g = warp; g < G; g += kWarps) {
    // The K tile serves as the warps' scratch rows (8 rows of hd fit in any tile) until the first tile lands.
    norm_rope_head_warp(qrow0 + static_cast<size_t>(g) * 2 * hd, q_norm, inv_freq, hd, d.n_rot, d.eps,
                        static_cast<float>(pos), kt + warp * hd, q + g * hd);
  }
  for (int e = static_cast<int>(threadIdx.x); e < G * hd; e += blockDim.x) acc[e] = 0.0f;
  for (int g = static_cast<int>(threadIdx.x); g < G; g += blockDim.x) m_s[g] = -INFINITY, l_s[g] = 0.0f;
  __syncthreads();

  const float* kbase = cache.k + static_cast<size_t>(j) * hd;
  const float* vbase = cache.v + static_cast<size_t>(j) * hd;
  const int32_t* pages = cache.pages + static_cast<int64_t>(slot) * cache.max_pages;
  const int len = chunk_len_of(pos, n_chunks);
  const int p_begin = c * len;
  const int p_end = min(pos + 1, p_begin + len);
  for (int p0 = p_begin; p0 < p_end; p0 += tile) {
    const int n = min(tile, p_end - p0);
    load_tile(kbase, cache, pages, p0, n, hd, kt);
    load_tile(vbase, cache, pages, p0, n, hd, vt);
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < G * tile; e += blockDim.x) {
      const int g = e / tile, t = e - g * tile;
      float s = -INFINITY;
      if (t < n) {
        const float* qv = q + g * hd;
        const float* kv = kt + t * stride;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        int i = 0;
        for (; i + 4 <= hd; i += 4) {
          a0 = fmaf(qv[i], kv[i], a0);
          a1 = fmaf(qv[i + 1], kv[i + 1], a1);
          a2 = fmaf(qv[i + 2], kv[i + 2], a2);
          a3 = fmaf(qv[i + 3], kv[i + 3], a3);
        }
        for (; i < hd; ++i) a0 = fmaf(qv[i], kv[i], a0);
        s = ((a0 + a1) + (a2 + a3)) * scale;
      }
      pr[e] = s;
    }
    __syncthreads();
    for (int g = warp; g < G; g += kWarps) {
      const float s = lane < tile ? pr[g * tile + lane] : -INFINITY;
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, warp_max(s));  // finite: the tile holds at least one position
      const float e = lane < n ? expf(s - m_new) : 0.0f;
      const float sum = warp_sum(e);
      __syncwarp();
      if (lane < tile) pr[g * tile + lane] = e;
      if (lane == 0) {
        const float corr = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        corr_s[g] = corr;
        l_s[g] = l_s[g] * corr + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < G * hd; e += blockDim.x) {
      const int g = e / hd, i = e - g * hd;
      const float* pg = pr + g * tile;
      float a = acc[e] * corr_s[g];
      for (int t = 0; t < n; ++t) a = fmaf(pg[t], vt[t * stride + i], a);
      acc[e] = a;
    }
    __syncthreads();
  }

  if (n_chunks == 1) {
    for (int e = static_cast<int>(threadIdx.x); e < G * hd; e += blockDim.x) {
      const int g = e / hd, i = e - g * hd;
      const int h = j * G + g;
      const float gate = qrow0[static_cast<size_t>(g) * 2 * hd + hd + i];
      out[static_cast<size_t>(b) * d.n_head * hd + static_cast<size_t>(h) * hd + i] =
          (acc[e] / l_s[g]) * sigmoid_f(gate);
    }
  } else {
    for (int g = 0; g < G; ++g) {
      float* rec = ws + chunk_record(b, j * G + g, c, d.n_head, max_chunks, hd);
      if (threadIdx.x == 0) {
        rec[0] = m_s[g];  // -inf with sum 0 for an empty chunk: the merge weighs it 0
        rec[1] = l_s[g];
      }
      for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) rec[2 + i] = acc[g * hd + i];
    }
  }
}

// Head h of sequence b from its n_chunks chunk records, in chunk order, into its columns of out.
__device__ __forceinline__ void merge_head(const AttnDecodeDims& d, const float* __restrict__ qg, int64_t qg_stride,
                                           int n_chunks, int max_chunks, const float* __restrict__ ws, float* out,
                                           int h, int b) {
  const int hd = d.head_dim;
  const float* first = ws + chunk_record(b, h, 0, d.n_head, max_chunks, hd);
  const size_t rec_stride = static_cast<size_t>(hd) + 2;
  float m_all = first[0];
  for (int c = 1; c < n_chunks; ++c) m_all = fmaxf(m_all, first[c * rec_stride]);
  float l_all = 0.0f;
  for (int c = 0; c < n_chunks; ++c) l_all += first[c * rec_stride + 1] * expf(first[c * rec_stride] - m_all);
  const float* gate =
      qg + static_cast<size_t>(b) * static_cast<size_t>(qg_stride) + static_cast<size_t>(h) * 2 * hd + hd;
  float* orow = out + static_cast<size_t>(b) * d.n_head * hd + static_cast<size_t>(h) * hd;
  for (int i = static_cast<int>(threadIdx.x); i < hd; i += blockDim.x) {
    float a = 0.0f;
    for (int c = 0; c < n_chunks; ++c) a += first[c * rec_stride + 2 + i] * expf(first[c * rec_stride] - m_all);
    orow[i] = (a / l_all) * sigmoid_f(gate[i]);
  }
}

// grid (n_head, n_seq): merges the chunk records of sequences with more than one chunk, in chunk order; with xprep,
// then writes head h's groups of the output row in prepared form (hd a multiple of 256: the head's columns are whole
// groups), whichever kernel finished the row.
__global__ void merge_chunks_kernel(AttnDecodeDims d, const float* __restrict__ qg, int64_t qg_stride,
                                    const int32_t* __restrict__ positions, int max_chunks, const float* __restrict__ ws,
                                    float* out, uint8_t* xprep, imma_prep::XLayout lay) {
  const int h = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int hd = d.head_dim;
  const int n_chunks = n_chunks_of(positions[b], d);
  if (n_chunks > 1) merge_head(d, qg, qg_stride, n_chunks, max_chunks, ws, out, h, b);
  if (xprep == nullptr) return;
  __syncthreads();  // this block's writes of the row (an earlier kernel's are complete)
  const int per_head = hd / imma_prep::kGroupElems;
  for (int q = static_cast<int>(threadIdx.x) / 32; q < per_head; q += kWarps) {
    imma_prep::prepare_group(imma_prep::L2Rows{out}, d.n_head * hd, lay, xprep, b, h * per_head + q,
                             static_cast<int>(threadIdx.x) % 32);
  }
}

}  // namespace

bool attention_prepares_out(const AttnDecodeDims& d) {
  return d.head_dim % imma_prep::kGroupElems == 0 && int64_t{d.n_head} * d.head_dim <= kImmaMaxCols;
}

size_t attention_decode_workspace_bytes(const AttnDecodeDims& d, int n_seq, int n_ctx) {
  if (d.chunk < 1 || d.max_chunks < 1 || n_seq < 1 || n_ctx < 1 || d.n_head < 1 || d.head_dim < 1) return 0;
  const size_t max_chunks = static_cast<size_t>(n_chunks_of(n_ctx - 1, d));
  return static_cast<size_t>(n_seq) * static_cast<size_t>(d.n_head) * max_chunks *
         (static_cast<size_t>(d.head_dim) + 2) * sizeof(float);
}

namespace {

// The page table's own consistency (what every call needs of it); kInvalidArgument naming the field.
Status check_page_table(const KvPageTable& t, bool need_rows) {
  const auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "attention_decode: the KV page table " + what);
  };
  if (t.pages == nullptr || (need_rows && (t.k == nullptr || t.v == nullptr))) return bad("has a null pointer");
  if (t.page_size < 1 || (t.page_size & (t.page_size - 1)) != 0) {
    return bad("has pages of " + std::to_string(t.page_size) + " positions (a power of two is needed)");
  }
  if (t.max_pages < 1) return bad("has " + std::to_string(t.max_pages) + " entries per slot");
  // Rows of a multiple of 4 floats are staged with 16-byte loads: their addresses must keep that alignment.
  if (need_rows && t.head_dim % 4 == 0 &&
      (t.page_stride % 4 != 0 || reinterpret_cast<uintptr_t>(t.k) % 16 != 0 ||
       reinterpret_cast<uintptr_t>(t.v) % 16 != 0)) {
    return bad("is not 16-byte aligned (K, V and the page stride must be, for rows of a multiple of 4 floats)");
  }
  if (need_rows && t.page_stride < static_cast<int64_t>(t.page_size) * t.n_head_kv * t.head_dim) {
    return bad("has pages " + std::to_string(t.page_stride) + " floats apart, less than a page's " +
               std::to_string(t.page_size) + " rows of " + std::to_string(t.n_head_kv) + " x " +
               std::to_string(t.head_dim));
  }
  return ok_status();
}

// One thread per sequence: the entry of the page its new token goes to.
__global__ void kv_page_publish_kernel(int32_t* __restrict__ table, int max_pages, int page_size,
                                       const int32_t* __restrict__ slot_ids, const int32_t* __restrict__ positions,
                                       const int32_t* __restrict__ page_ids, int n_seq) {
  const int shift = __ffs(page_size) - 1;
  for (int b = static_cast<int>(threadIdx.x); b < n_seq; b += blockDim.x) {
    table[static_cast<int64_t>(slot_ids[b]) * max_pages + (positions[b] >> shift)] = page_ids[b];
  }
}

}  // namespace

Status attention_decode(const AttnDecodeDims& d, const KvPageTable& cache, int n_slots, const AttnDecodeArgs& a,
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
  KESTREL_TRY(check_page_table(cache, true));
  if (cache.n_head_kv != d.n_head_kv || cache.head_dim != d.head_dim) {
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
    if (p < 0 || p >= cache.capacity()) {
      return make_error(ErrorCode::kOutOfRange, "attention_decode: sequence " + std::to_string(b) + " (slot " +
                                                    std::to_string(s) + ") is at position " + std::to_string(p) +
                                                    ", the page table holds " + std::to_string(cache.capacity()) +
                                                    " tokens a slot (raise the context size)");
    }
  }
  int max_pos = 0;
  for (int32_t p : positions_host) max_pos = std::max(max_pos, static_cast<int>(p));
  return attention_decode_device(d, cache, a, static_cast<int>(n_seq), max_pos, stream);
}

Status attention_decode_device(const AttnDecodeDims& d, const KvPageTable& cache, const AttnDecodeArgs& a, int n_seq,
                               int max_position, cudaStream_t stream) {
  const auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "attention_decode: " + what);
  };
  if (n_seq < 1 || n_seq > 65535 || max_position < 0 || d.chunk < 1 || d.max_chunks < 1 || d.max_chunks > 65535) {
    return bad(std::to_string(n_seq) + " sequences, position bound " + std::to_string(max_position) + ", chunk " +
               std::to_string(d.chunk) + ", max_chunks " + std::to_string(d.max_chunks));
  }
  KESTREL_TRY(check_page_table(cache, true));
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
  const int64_t qg_packed = int64_t{d.n_head} * 2 * d.head_dim, kv_packed = int64_t{d.n_head_kv} * d.head_dim;
  const int64_t qg_stride = a.qg_stride == 0 ? qg_packed : a.qg_stride;
  const int64_t kv_stride = a.kv_stride == 0 ? kv_packed : a.kv_stride;
  if (a.out_prepared != nullptr &&
      (!attention_prepares_out(d) || imma_x_bytes(int64_t{d.n_head} * d.head_dim, n_seq) == 0 ||
       reinterpret_cast<uintptr_t>(a.out_prepared) % 16 != 0 || reinterpret_cast<uintptr_t>(a.out) % 16 != 0)) {
    return bad(
        "out_prepared needs head_dim a multiple of 256, an output row gemv_imma takes, and 16-byte aligned "
        "out and out_prepared");
  }
  if (qg_stride < qg_packed || kv_stride < kv_packed) {
    return bad("row strides " + std::to_string(qg_stride) + " (q|gate) and " + std::to_string(kv_stride) +
               " (k, v) are narrower than the rows");
  }
  const unsigned seqs = static_cast<unsigned>(n_seq);
  kv_append_kernel<<<dim3(static_cast<unsigned>(d.n_head_kv), seqs), kThreads, 0, stream>>>(
      d, cache, a.k, a.v, kv_stride, a.k_norm, a.rope_inv_freq, a.slot_ids, a.positions);
  KESTREL_CUDA_TRY(cudaGetLastError());
  const int group = d.n_head / d.n_head_kv;
  const int tile = attend_tile_of(group, d.head_dim);
  const size_t smem = attend_smem_floats(group, d.head_dim, tile) * sizeof(float);
  KESTREL_TRY(check_smem<attend_kernel>(smem, [&] {
    return "attention_decode: a group of " + std::to_string(group) + " query heads of " + std::to_string(d.head_dim) +
           " dims";
  }));
  attend_kernel<<<dim3(static_cast<unsigned>(d.n_head_kv), seqs, static_cast<unsigned>(max_chunks)), kThreads, smem,
                  stream>>>(d, cache, a.qg, qg_stride, a.q_norm, a.rope_inv_freq, a.slot_ids, a.positions, scale,
                            max_chunks, tile, a.workspace, a.out);
  KESTREL_CUDA_TRY(cudaGetLastError());
  if (max_chunks > 1 || a.out_prepared != nullptr) {
    merge_chunks_kernel<<<dim3(static_cast<unsigned>(d.n_head), seqs), kThreads, 0, stream>>>(
        d, a.qg, qg_stride, a.positions, max_chunks, a.workspace, a.out, static_cast<uint8_t*>(a.out_prepared),
        imma_prep::x_layout(int64_t{d.n_head} * d.head_dim));
    KESTREL_CUDA_TRY(cudaGetLastError());
  }
  return ok_status();
}

Status attention_kv_append_device(const AttnDecodeDims& d, const KvPageTable& cache, const AttnDecodeArgs& a, int n_seq,
                                  cudaStream_t stream) {
  if (n_seq < 1 || n_seq > 65535) {
    return make_error(ErrorCode::kInvalidArgument, "attention_kv_append: " + std::to_string(n_seq) + " sequences");
  }
  KESTREL_TRY(check_page_table(cache, true));
  const int64_t kv_packed = int64_t{d.n_head_kv} * d.head_dim;
  const int64_t kv_stride = a.kv_stride == 0 ? kv_packed : a.kv_stride;
  if (kv_stride < kv_packed) {
    return make_error(ErrorCode::kInvalidArgument,
                      "attention_kv_append: row stride " + std::to_string(kv_stride) + " is narrower than a k / v row");
  }
  kv_append_kernel<<<dim3(static_cast<unsigned>(d.n_head_kv), static_cast<unsigned>(n_seq)), kThreads, 0, stream>>>(
      d, cache, a.k, a.v, kv_stride, a.k_norm, a.rope_inv_freq, a.slot_ids, a.positions);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

Status kv_page_publish(const KvPageTable& table, const int32_t* slot_ids, const int32_t* positions,
                       const int32_t* page_ids, int n_seq, cudaStream_t stream) {
  KESTREL_TRY(check_page_table(table, false));
  if (n_seq < 1 || slot_ids == nullptr || positions == nullptr || page_ids == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv_page_publish: " + std::to_string(n_seq) + " sequences (>= 1) or a null pointer");
  }
  kv_page_publish_kernel<<<1, 128, 0, stream>>>(table.pages, table.max_pages, table.page_size, slot_ids, positions,
                                                page_ids, n_seq);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
