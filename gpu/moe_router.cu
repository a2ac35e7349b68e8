// moe_route (see moe_router.h): one block of kWarps (32) warps.
//
// Phase 1, warp w routes tokens w, w + kWarps, ...: the token's logits are copied to the warp's slice of shared
// memory (f32 [E]), max by lane-strided max + butterfly (exact), p_e = expf(l_e − max), Σ lane-strided (index order
// within a lane) + butterfly, p_e /= Σ; then k rounds of arg-max over the not-yet-taken experts (per lane, then a
// butterfly that prefers the larger p and, on equal p, the lower index: the reference's total order), the winner's
// p recorded and its slot set to −1. Lane 0 sums the k selected p in selection order and divides by the clamped sum.
// Phase 2 (after a barrier), the grouping: per-expert counts over the block's shared copy of the ids, an exclusive
// scan by warp 0 (32 experts per step) of the counts and of the active flags, then thread e writes expert e's
// entries in token order, and each token's entries are ranked by expert id.
#include <algorithm>
#include <cmath>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/moe_router.h"

namespace kestrel::gpu {
namespace {

constexpr int kWarps = 32;  // one warp per token for up to kMoeMaxTokens tokens (phase 1 runs them all at once)
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr float kWeightSumMin = 6.103515625e-5f;  // 2^-14, as ref::kMoeWeightSumMin

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Dynamic shared memory: p f32 [kWarps][E], then counts / offsets / ranks int32 [E] each.
__global__ void __launch_bounds__(kThreads)
    moe_route_kernel(const float* __restrict__ logits, int n_tok, int n_expert, int k, MoeRouting r) {
  extern __shared__ float smem[];
  float* p_all = smem;
  int* counts = reinterpret_cast<int*>(smem + min(kWarps, n_tok) * n_expert);  // p only for warps with a token
  int* offsets = counts + n_expert;
  int* ranks = offsets + n_expert;
  __shared__ int ids_s[kMoeMaxTokens * kMoeMaxUsed];

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  float* p = p_all + warp * n_expert;

  for (int t = warp; t < n_tok; t += kWarps) {
    const float* lg = logits + static_cast<size_t>(t) * n_expert;
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += 32) {
      const float v = lg[e];
      p[e] = v;
      mx = fmaxf(mx, v);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
    float sum = 0.0f;
    for (int e = lane; e < n_expert; e += 32) {
      const float ex = expf(__fsub_rn(p[e], mx));
      p[e] = ex;
      sum = __fadd_rn(sum, ex);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(kFullMask, sum, off));
    for (int e = lane; e < n_expert; e += 32) p[e] = __fdiv_rn(p[e], sum);
    __syncwarp();

    float sel_sum = 0.0f;
    float my_w = 0.0f;  // lane j keeps the p of selection j
    int my_id = 0;
    for (int j = 0; j < k; ++j) {
      float best_p = -1.0f;
      int best_e = n_expert;
      for (int e = lane; e < n_expert; e += 32) {
        if (p[e] > best_p) {  // strict: the lowest index among equals within the lane
          best_p = p[e];
          best_e = e;
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        const float op = __shfl_xor_sync(kFullMask, best_p, off);
        const int oe = __shfl_xor_sync(kFullMask, best_e, off);
        if (op > best_p || (op == best_p && oe < best_e)) {
          best_p = op;
          best_e = oe;
        }
      }
      __syncwarp();
      if (lane == 0) p[best_e] = -1.0f;  // taken (every p is >= 0)
      __syncwarp();
      sel_sum = __fadd_rn(sel_sum, best_p);  // every lane, same order
      if (lane == j) {
        my_w = best_p;
        my_id = best_e;
      }
    }
    const float denom = fmaxf(sel_sum, kWeightSumMin);
    if (lane < k) {
      r.ids[t * k + lane] = my_id;
      r.weights[t * k + lane] = __fdiv_rn(my_w, denom);
      ids_s[t * k + lane] = my_id;
    }
  }
  __syncthreads();

  // Grouping.
  const int n_entries = n_tok * k;
  for (int e = tid; e < n_expert; e += kThreads) {
    int c = 0;
    for (int i = 0; i < n_entries; ++i) c += ids_s[i] == e ? 1 : 0;
    counts[e] = c;
  }
  __syncthreads();
  if (warp == 0) {
    int run_off = 0;
    int run_rank = 0;
    for (int base = 0; base < n_expert; base += 32) {
      const int e = base + lane;
      const int c = e < n_expert ? counts[e] : 0;
      const int a = c > 0 ? 1 : 0;
      int inc_c = c;
      int inc_a = a;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int oc = __shfl_up_sync(kFullMask, inc_c, off);
        const int oa = __shfl_up_sync(kFullMask, inc_a, off);
        if (lane >= off) {
          inc_c += oc;
          inc_a += oa;
        }
      }
      if (e < n_expert) {
        offsets[e] = run_off + inc_c - c;
        ranks[e] = run_rank + inc_a - a;
      }
      run_off += __shfl_sync(kFullMask, inc_c, 31);
      run_rank += __shfl_sync(kFullMask, inc_a, 31);
    }
    if (lane == 0) {
      *r.n_active = run_rank;
      r.active_offset[run_rank] = run_off;
    }
  }
  __syncthreads();
  for (int e = tid; e < n_expert; e += kThreads) {
    if (counts[e] == 0) continue;
    const int rank = ranks[e];
    int pos = offsets[e];
    r.active_expert[rank] = e;
    r.active_offset[rank] = pos;
    for (int t = 0; t < n_tok; ++t) {
      for (int j = 0; j < k; ++j) {
        if (ids_s[t * k + j] != e) continue;
        r.entry_token[pos] = t;
        r.entry_weight[pos] = r.weights[t * k + j];
        int below = 0;  // the token's selections with a lower expert id
        for (int jj = 0; jj < k; ++jj) below += ids_s[t * k + jj] < e ? 1 : 0;
        r.token_entry[t * k + below] = pos;
        ++pos;
      }
    }
  }
}

}  // namespace

size_t moe_routing_bytes(int n_tok, int n_expert, int k) {
  const size_t e = static_cast<size_t>(n_tok) * static_cast<size_t>(k);
  const size_t act = std::min(static_cast<size_t>(n_expert), e);
  return 2 * align16(e * 4) + align16(4) + align16(act * 4) + align16((act + 1) * 4) + 3 * align16(e * 4);
}

MoeRouting moe_routing_carve(void* base, int n_tok, int n_expert, int k) {
  const size_t e = static_cast<size_t>(n_tok) * static_cast<size_t>(k);
  const size_t act = std::min(static_cast<size_t>(n_expert), e);
  auto* p = static_cast<unsigned char*>(base);
  auto take = [&p](size_t bytes) {
    unsigned char* at = p;
    p += align16(bytes);
    return at;
  };
  MoeRouting r;
  r.ids = reinterpret_cast<int32_t*>(take(e * 4));
  r.weights = reinterpret_cast<float*>(take(e * 4));
  r.n_active = reinterpret_cast<int32_t*>(take(4));
  r.active_expert = reinterpret_cast<int32_t*>(take(act * 4));
  r.active_offset = reinterpret_cast<int32_t*>(take((act + 1) * 4));
  r.entry_token = reinterpret_cast<int32_t*>(take(e * 4));
  r.entry_weight = reinterpret_cast<float*>(take(e * 4));
  r.token_entry = reinterpret_cast<int32_t*>(take(e * 4));
  return r;
}

Status moe_route(const float* logits, int n_tok, int n_expert, int k, const MoeRouting& r, cudaStream_t stream) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "moe_route: " + m); };
  if (n_tok < 1 || n_tok > kMoeMaxTokens) {
    return bad("n_tok " + std::to_string(n_tok) + " outside [1, " + std::to_string(kMoeMaxTokens) + "]");
  }
  if (n_expert < 1 || n_expert > kMoeMaxExperts) {
    return bad("n_expert " + std::to_string(n_expert) + " outside [1, " + std::to_string(kMoeMaxExperts) + "]");
  }
  if (k < 1 || k > n_expert || k > kMoeMaxUsed) {
    return bad("k " + std::to_string(k) + " outside [1, min(n_expert, " + std::to_string(kMoeMaxUsed) + ")]");
  }
  if (logits == nullptr || r.ids == nullptr || r.weights == nullptr || r.n_active == nullptr ||
      r.active_expert == nullptr || r.active_offset == nullptr || r.entry_token == nullptr ||
      r.entry_weight == nullptr || r.token_entry == nullptr) {
    return bad("a null pointer (logits or a MoeRouting field)");
  }
  const size_t smem =
      static_cast<size_t>(std::min(kWarps, n_tok)) * n_expert * 4 + 3 * static_cast<size_t>(n_expert) * 4;
  static const cudaError_t attr = cudaFuncSetAttribute(  // up to 140 KiB at E = 1024, 32 tokens
      moe_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(kWarps * kMoeMaxExperts * 4 + 3 * kMoeMaxExperts * 4));
  KESTREL_CUDA_TRY(attr);
  moe_route_kernel<<<1, kThreads, smem, stream>>>(logits, n_tok, n_expert, k, r);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
