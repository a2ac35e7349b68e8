// moe_imma_prompt (see moe_imma_prompt.h): the routing, grouping and table kernels for up to kMoePromptMaxTokens
// tokens, and the call that runs them with moe_imma's router launch, the grouped GEMVs and the combine.
#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/gemm_imma.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/moe_combine.cuh"
#include "gpu/kernels/moe_hybrid.h"
#include "gpu/kernels/moe_imma_prompt.h"
#include "gpu/kernels/moe_route.cuh"
#include "gpu/kernels/smem_optin.cuh"
#include "gpu/memory/scratch_carve.h"
#include "gpu/memory/tiled_matrix.h"

namespace kestrel::gpu {
namespace {

constexpr int kRouteWarps = 8;       // tokens a routing block routes (a warp each)
constexpr int kGroupThreads = 1024;  // the grouping block: a thread per expert (kMoeMaxExperts)
static_assert(kGroupThreads >= kMoeMaxExperts, "a thread per expert");
static_assert(kMoePromptMaxTokens * kMoeMaxUsed < (1 << 16), "packed scan fields");

Status bad(const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "moe_imma_prompt: " + m); }
Status unsupported(const std::string& m) { return make_error(ErrorCode::kUnsupported, "moe_imma_prompt: " + m); }

// Sizes of a call laid out for any segment width (width 1 has the most chunks).
struct Sizes {
  int n_tok = 0, n_entries = 0, n_all = 0;
  int max_chunks = 0;  // routed chunks + the shared expert's, at width 1
};

Sizes sizes_of(const MoeImmaWeights& w, int n_tok) {
  Sizes s;
  s.n_tok = n_tok;
  s.n_entries = n_tok * w.n_expert_used;
  s.n_all = s.n_entries + (w.has_shared_expert() ? n_tok : 0);
  s.max_chunks = s.n_all;
  return s;
}

// The most segments a call can fill at segment width C: an expert with c > 0 entries has ⌈c/C⌉ <= ⌊c/C⌋ + 1 chunks,
// so the routed ones are at most ⌊n_entries/C⌋ + min(E, n_entries), plus the shared expert's ⌈n_tok/C⌉. The GEMMs'
// grids take this many segments, not the tables' max_chunks (width 1's): at 512 tokens, 8 a segment, 832 instead of
// 4608, and blocks past the count in use still cost a launch and a read of it each.
int chunk_bound(const Sizes& s, int n_expert, int width, bool shared) {
  const int routed = s.n_entries / width + std::min(n_expert, s.n_entries);
  const int sh = shared ? (s.n_tok + width - 1) / width : 0;
  return std::min(s.max_chunks, routed + sh);
}

struct Layout {
  float* logits = nullptr;         // f32 [T, E]
  int32_t* sel_id = nullptr;       // [T, k] selections by descending p
  float* sel_w = nullptr;          // [T, k] their weights
  int32_t* entry_token = nullptr;  // [T·k] entries by expert, then token
  float* entry_weight = nullptr;   // [T·k]
  int32_t* token_entry = nullptr;  // [T, k] each token's entries by ascending expert id
  uint8_t* xprep = nullptr;        // imma_x_bytes(H, T)
  ImmaSegment* seg_gu = nullptr;   // [2 · max_chunks]
  ImmaSegment* seg_dn = nullptr;   // [max_chunks]
  float* gu = nullptr;             // f32 [2 · n_all, I]: gate rows, then up rows
  uint8_t* aprep = nullptr;        // n_all prepared vectors of I
  float* ye = nullptr;             // f32 [n_all, H]
  int32_t* n_used = nullptr;       // [2]: segments in use, gate+up and down
  size_t bytes = 0;
};

Layout layout_of(const MoeImmaWeights& w, const Sizes& s, void* base) {
  const size_t T = static_cast<size_t>(s.n_tok), E = static_cast<size_t>(w.n_expert);
  const size_t K = static_cast<size_t>(w.n_expert_used), all = static_cast<size_t>(s.n_all);
  const size_t H = static_cast<size_t>(w.n_embd), I = static_cast<size_t>(w.n_ff);
  ScratchCarve c(base);
  Layout l;
  l.logits = c.take<float>(T * E * 4);
  l.sel_id = c.take<int32_t>(T * K * 4);
  l.sel_w = c.take<float>(T * K * 4);
  l.entry_token = c.take<int32_t>(T * K * 4);
  l.entry_weight = c.take<float>(T * K * 4);
  l.token_entry = c.take<int32_t>(T * K * 4);
  l.xprep = c.take(imma_x_bytes(w.n_embd, s.n_tok));
  l.seg_gu = c.take<ImmaSegment>(2 * static_cast<size_t>(s.max_chunks) * sizeof(ImmaSegment));
  l.seg_dn = c.take<ImmaSegment>(static_cast<size_t>(s.max_chunks) * sizeof(ImmaSegment));
  l.gu = c.take<float>(2 * all * I * 4);
  l.aprep = c.take(all * imma_x_bytes(w.n_ff, 1));
  l.ye = c.take<float>(all * H * 4);
  l.n_used = c.take<int32_t>(2 * sizeof(int32_t));
  l.bytes = c.bytes();
  return l;
}

// ---- kernels -----------------------------------------------------------------------------------------------------

// Token t = blockIdx.x · kRouteWarps + warp: its k selections and weights (moe_route's route_one) into sel_id / sel_w.
template <int kPer>
__global__ void __launch_bounds__(32 * kRouteWarps)
    route_kernel(const float* __restrict__ logits, int n_tok, int n_expert, int k, int32_t* sel_id, float* sel_w) {
  const int t = static_cast<int>(blockIdx.x) * kRouteWarps + static_cast<int>(threadIdx.x) / 32;
  if (t >= n_tok) return;
  MoeRouting r{};
  r.ids = sel_id;
  r.weights = sel_w;
  moe_route_dev::route_one<kPer>(logits, t, n_expert, k, static_cast<int>(threadIdx.x) % 32, r, nullptr);
}

struct TableArgs {
  const int32_t* sel_id;
  const float* sel_w;
  int32_t* entry_token;
  float* entry_weight;
  int32_t* token_entry;
  const uint8_t* gate;  // tiled stacks
  const uint8_t* up;
  const uint8_t* down;
  uint64_t gu_bytes;  // one expert's gate (= up) matrix
  uint64_t dn_bytes;  // one expert's down matrix
  const void* sh_gate;
  const void* sh_up;
  const void* sh_down;
  int n_tok, n_expert, k, n_entries, n_all, chunk, sh_chunks;
  ImmaSegment* seg_gu;
  ImmaSegment* seg_dn;
  int32_t* n_used;
  // Hybrid layers: expert id → index in the compact stacks, < 0 for a host expert (no chunks; its entries' weights
  // set to −1, its choices into host_choices); null when the stacks hold every expert.
  const int32_t* resident;
  ExpertChoice* host_choices;  // [T, k] in selection order (hybrid layers)
};

// Segment `s` ← matrix `data`, n vectors: vec(j) → out0 + j, stored in 16-byte pieces.
template <class Vec>
__device__ __forceinline__ void put_segment(ImmaSegment* s, const void* data, int n, Vec&& vec, int out0) {
  alignas(16) ImmaSegment seg{};
  seg.data = data;
  seg.n_vec = n;
  for (int j = 0; j < n; ++j) {
    seg.vec[j] = vec(j);
    seg.out[j] = out0 + j;
  }
  const uint4* src = reinterpret_cast<const uint4*>(&seg);
  uint4* dst = reinterpret_cast<uint4*>(s);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(ImmaSegment) / 16); ++i) dst[i] = src[i];
}

// The grouping and the tables, one block of kGroupThreads threads; dynamic shared memory: E · W token masks (W =
// ⌈T/32⌉ words each), then the experts' first entries and first chunks.
__global__ void __launch_bounds__(kGroupThreads) group_tables_kernel(TableArgs a) {
  extern __shared__ unsigned group_smem[];
  using Scan = cub::BlockScan<int, kGroupThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int used_s;
  const int tid = static_cast<int>(threadIdx.x);
  const int E = a.n_expert, k = a.k;
  const int W = (a.n_tok + 31) / 32;
  unsigned* mask = group_smem;                              // [E][W]
  int* first = reinterpret_cast<int*>(group_smem + E * W);  // [E] first entry
  int* chunk0 = first + E;                                  // [E] first routed chunk
  for (int i = tid; i < E * W; i += kGroupThreads) mask[i] = 0u;
  __syncthreads();
  for (int i = tid; i < a.n_entries; i += kGroupThreads) {
    const int t = i / k;
    atomicOr(&mask[a.sel_id[i] * W + t / 32], 1u << (t % 32));
  }
  __syncthreads();
  // Expert e's entries and chunks start at the exclusive scans of the counts and of ⌈count/C⌉.
  int count = 0;
  if (tid < E) {
    for (int j = 0; j < W; ++j) count += __popc(mask[tid * W + j]);
  }
  const bool here = tid < E && (a.resident == nullptr || a.resident[tid] >= 0);
  const int chunks = here ? (count + a.chunk - 1) / a.chunk : 0;
  int packed = 0, total = 0;
  Scan(scan_tmp).ExclusiveSum(count | chunks << 16, packed, total);
  if (tid < E) {
    first[tid] = packed & 0xFFFF;
    chunk0[tid] = packed >> 16;
  }
  if (tid == 0) used_s = a.sh_chunks + (total >> 16);
  __syncthreads();
  // Entry (t, j) of expert x: after the tokens below t that chose x; the token's list by ascending expert id.
  for (int i = tid; i < a.n_entries; i += kGroupThreads) {
    const int t = i / k;
    const int x = a.sel_id[i];
    int below_t = __popc(mask[x * W + t / 32] & ((1u << (t % 32)) - 1u));
    for (int j = 0; j < t / 32; ++j) below_t += __popc(mask[x * W + j]);
    const int pos = first[x] + below_t;
    const bool host = a.resident != nullptr && a.resident[x] < 0;
    a.entry_token[pos] = t;
    a.entry_weight[pos] = host ? -1.0f : a.sel_w[i];
    if (a.resident != nullptr) a.host_choices[i] = host ? ExpertChoice{x, a.sel_w[i]} : ExpertChoice{};
    int below = 0;
    for (int jj = 0; jj < k; ++jj) below += a.sel_id[t * k + jj] < x ? 1 : 0;
    a.token_entry[t * k + below] = pos;
  }
  __syncthreads();  // entry_token is read back below by other threads of the block
  const int used = used_s;
  for (int c = tid; c < used; c += kGroupThreads) {
    if (c < a.sh_chunks) {  // the shared expert: tokens cC .., rows n_entries + token
      const int t0 = c * a.chunk;
      const int n = min(a.chunk, a.n_tok - t0);
      const int row0 = a.n_entries + t0;
      auto tok = [&](int j) { return t0 + j; };
      auto row = [&](int j) { return row0 + j; };
      put_segment(a.seg_gu + 2 * c, a.sh_gate, n, tok, row0);
      put_segment(a.seg_gu + 2 * c + 1, a.sh_up, n, tok, a.n_all + row0);
      put_segment(a.seg_dn + c, a.sh_down, n, row, row0);
      continue;
    }
    // Routed chunk q: the expert whose chunks hold it (the last with chunk0 <= q; experts without chunks share the
    // next one's chunk0), its entries first + (q − chunk0)·C ...
    const int q = c - a.sh_chunks;
    int lo = 0, hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (chunk0[mid] <= q) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int x = lo;
    const int row0 = first[x] + (q - chunk0[x]) * a.chunk;
    const int end = x + 1 < E ? first[x + 1] : a.n_entries;
    const int n = min(a.chunk, end - row0);
    const uint64_t at = static_cast<uint64_t>(a.resident != nullptr ? a.resident[x] : x);  // index in the stacks
    auto tok = [&](int j) { return a.entry_token[row0 + j]; };
    auto row = [&](int j) { return row0 + j; };
    put_segment(a.seg_gu + 2 * c, a.gate + at * a.gu_bytes, n, tok, row0);
    put_segment(a.seg_gu + 2 * c + 1, a.up + at * a.gu_bytes, n, tok, a.n_all + row0);
    put_segment(a.seg_dn + c, a.down + at * a.dn_bytes, n, row, row0);
  }
  if (tid == 0) {
    a.n_used[0] = 2 * used;
    a.n_used[1] = used;
  }
}

// out[t] as moe_imma's combine: Σ over token t's entries (ascending expert id) of ye · w from 0, then with kShared
// + sigmoid(gate_inp · x[t]) · ye[n_entries + t].
template <GgmlType T, bool kShared>
__global__ void __launch_bounds__(moe_combine::kThreads)
    combine_kernel(const float* __restrict__ ye, const int32_t* __restrict__ token_entry,
                   const float* __restrict__ entry_weight, int k, int n_entries, const uint8_t* __restrict__ gate_inp,
                   const float* __restrict__ x, int h, float* __restrict__ out) {
  const int t = static_cast<int>(blockIdx.y);
  const int c = static_cast<int>(blockIdx.x) * moe_combine::kThreads + static_cast<int>(threadIdx.x);
  float s = 0.0f;
  if constexpr (kShared) s = moe_combine::shared_gate<T>(gate_inp, x + static_cast<int64_t>(t) * h, h);
  if (c >= h) return;
  float y = moe_combine::routed_sum(ye, token_entry, entry_weight, k, t, c, h);
  if constexpr (kShared) y = __fadd_rn(y, __fmul_rn(s, ye[static_cast<int64_t>(n_entries + t) * h + c]));
  out[static_cast<int64_t>(t) * h + c] = y;
}

size_t group_smem_bytes(const MoeImmaWeights& w, int n_tok) {
  const size_t W = static_cast<size_t>((n_tok + 31) / 32);
  return (static_cast<size_t>(w.n_expert) * W + 2 * static_cast<size_t>(w.n_expert)) * sizeof(unsigned);
}

}  // namespace

size_t moe_imma_prompt_workspace_bytes(const MoeImmaWeights& w, int n_tok) {
  if (n_tok < 1 || n_tok > kMoePromptMaxTokens) return 0;
  return layout_of(w, sizes_of(w, n_tok), nullptr).bytes;
}

namespace {

// moe_imma_forward_prompt, and with `h` its hybrid form.
Status forward(const MoeImmaWeights& w, const float* x, int n_tok, float* out, void* workspace, cudaStream_t stream,
               int segment_vectors, const GemvImmaTuning& grouped_gemv, const MoeHybrid* h,
               const MoePhaseHooks* hooks) {
  if (h != nullptr) KESTREL_TRY(moe_hybrid_check(*h, w.n_expert));
  // A hybrid layer with no resident expert has no routed stacks on the device.
  if (h == nullptr || h->n_resident > 0) KESTREL_TRY(moe_imma_check_weights(w));
  if (n_tok < 1 || n_tok > kMoePromptMaxTokens) {
    return bad("n_tok " + std::to_string(n_tok) + " outside [1, " + std::to_string(kMoePromptMaxTokens) + "]");
  }
  if (segment_vectors < 1 || segment_vectors > kImmaSegmentVectors) {
    return bad("segment_vectors " + std::to_string(segment_vectors) + " outside [1, " +
               std::to_string(kImmaSegmentVectors) + "]");
  }
  if (x == nullptr || out == nullptr || workspace == nullptr || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return bad("x, out or workspace is null, or x / workspace is not 16-byte aligned");
  }
  const int E = static_cast<int>(w.n_expert), H = static_cast<int>(w.n_embd), I = static_cast<int>(w.n_ff);
  const int k = w.n_expert_used;
  const Sizes sz = sizes_of(w, n_tok);
  const Layout l = layout_of(w, sz, workspace);

  // Logits and x's prepared form, with moe_imma's arithmetic (an f32 router: one launch for every token).
  KESTREL_TRY(moe_imma_route_inputs(w, x, n_tok, l.logits, l.xprep, stream));
  if (hooks != nullptr && hooks->after_logits) KESTREL_TRY(hooks->after_logits());
  KESTREL_TRY(moe_route_dev::with_route_per_lane(E, [&](auto per) -> Status {
    constexpr int kPer = decltype(per)::value;
    route_kernel<kPer><<<(n_tok + kRouteWarps - 1) / kRouteWarps, 32 * kRouteWarps, 0, stream>>>(l.logits, n_tok, E, k,
                                                                                                 l.sel_id, l.sel_w);
    KESTREL_CUDA_TRY(cudaGetLastError());
    return ok_status();
  }));

  TableArgs ta{};
  ta.sel_id = l.sel_id;
  ta.sel_w = l.sel_w;
  ta.entry_token = l.entry_token;
  ta.entry_weight = l.entry_weight;
  ta.token_entry = l.token_entry;
  ta.gate = static_cast<const uint8_t*>(w.gate_exps);
  ta.up = static_cast<const uint8_t*>(w.up_exps);
  ta.down = static_cast<const uint8_t*>(w.down_exps);
  ta.gu_bytes = tiled_bytes(w.gate_up_type, H, I);
  ta.dn_bytes = tiled_bytes(w.down_type, I, H);
  ta.sh_gate = w.gate_shexp;
  ta.sh_up = w.up_shexp;
  ta.sh_down = w.down_shexp;
  ta.n_tok = n_tok;
  ta.n_expert = E;
  ta.k = k;
  ta.n_entries = sz.n_entries;
  ta.n_all = sz.n_all;
  ta.chunk = segment_vectors;
  ta.sh_chunks = w.has_shared_expert() ? (n_tok + segment_vectors - 1) / segment_vectors : 0;
  ta.seg_gu = l.seg_gu;
  ta.seg_dn = l.seg_dn;
  ta.n_used = l.n_used;
  ta.resident = h != nullptr ? h->resident : nullptr;
  ta.host_choices = h != nullptr ? h->host_choices : nullptr;
  const size_t smem = group_smem_bytes(w, n_tok);
  KESTREL_TRY(check_smem<group_tables_kernel>(smem, [&] {
    return "moe_imma_prompt: the grouping of " + std::to_string(n_tok) + " tokens over " + std::to_string(E) +
           " experts";
  }));
  group_tables_kernel<<<1, kGroupThreads, smem, stream>>>(ta);
  KESTREL_CUDA_TRY(cudaGetLastError());
  if (hooks != nullptr && hooks->after_route) KESTREL_TRY(hooks->after_route());

  // A hybrid layer with no resident expert and no shared expert has nothing for the GEMVs.
  if (h == nullptr || h->n_resident > 0 || w.has_shared_expert()) {
    const int seg_bound = std::min(n_tok, segment_vectors);
    // gemm_imma where it takes the type: each expert tile decoded once for a segment's tokens and 64 rows a warp.
    const bool gemm_gu = grouped_gemv.prompt_gemm && gemm_imma_supports(w.gate_up_type, H, I);
    const bool gemm_dn = grouped_gemv.prompt_gemm && gemm_imma_supports(w.down_type, I, H);
    const int n_seg = chunk_bound(sz, E, segment_vectors, w.has_shared_expert());
    if (gemm_gu) {
      KESTREL_TRY(gemm_imma_segments(w.gate_up_type, H, I, l.seg_gu, 2 * n_seg, l.xprep, l.gu, I, stream, l.n_used,
                                     grouped_gemv.prompt_digits));
    } else {
      KESTREL_TRY(gemv_imma_segments(w.gate_up_type, H, I, l.seg_gu, 2 * n_seg, l.xprep, l.gu, I, stream, seg_bound,
                                     false, l.n_used, false, grouped_gemv));
    }
    KESTREL_TRY(gemv_imma_prepare_swiglu(l.gu, l.gu + static_cast<size_t>(sz.n_all) * I, I, sz.n_all, l.aprep, stream));
    if (gemm_dn) {
      KESTREL_TRY(gemm_imma_segments(w.down_type, I, H, l.seg_dn, n_seg, l.aprep, l.ye, H, stream, l.n_used + 1,
                                     grouped_gemv.prompt_digits));
    } else {
      KESTREL_TRY(gemv_imma_segments(w.down_type, I, H, l.seg_dn, n_seg, l.aprep, l.ye, H, stream, seg_bound, false,
                                     l.n_used + 1, false, grouped_gemv));
    }
  }

  if (hooks != nullptr && hooks->before_combine) KESTREL_TRY(hooks->before_combine());
  if (h != nullptr) {
    MoeHybridCombine hc;
    hc.ye = l.ye;
    hc.token_entry = l.token_entry;
    hc.entry_weight = l.entry_weight;
    hc.k = k;
    hc.host_y = h->host_y;
    hc.sh = w.has_shared_expert() ? l.ye + static_cast<size_t>(sz.n_entries) * H : nullptr;
    hc.shared_gate_inp = w.shared_gate_inp;
    hc.x = x;
    hc.n_tok = n_tok;
    hc.h = H;
    hc.out = out;
    return moe_hybrid_combine(hc, stream);
  }

  const dim3 grid(static_cast<unsigned>((H + moe_combine::kThreads - 1) / moe_combine::kThreads),
                  static_cast<unsigned>(n_tok));
  if (w.has_shared_expert()) {
    const auto* gate_inp = static_cast<const uint8_t*>(w.shared_gate_inp.data);
    return dispatch_dequant_type(
        w.shared_gate_inp.type,
        [&](auto tag) -> Status {
          constexpr GgmlType T = decltype(tag)::value;
          combine_kernel<T, true><<<grid, moe_combine::kThreads, 0, stream>>>(l.ye, l.token_entry, l.entry_weight, k,
                                                                              sz.n_entries, gate_inp, x, H, out);
          KESTREL_CUDA_TRY(cudaGetLastError());
          return ok_status();
        },
        unsupported("ffn_gate_inp_shexp type " + std::string(ggml_type_name(w.shared_gate_inp.type))));
  }
  combine_kernel<GgmlType::kF32, false><<<grid, moe_combine::kThreads, 0, stream>>>(
      l.ye, l.token_entry, l.entry_weight, k, sz.n_entries, nullptr, x, H, out);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace

Status moe_imma_forward_prompt(const MoeImmaWeights& w, const float* x, int n_tok, float* out, void* workspace,
                               cudaStream_t stream, int segment_vectors, const GemvImmaTuning& grouped_gemv,
                               const MoePhaseHooks* hooks) {
  return forward(w, x, n_tok, out, workspace, stream, segment_vectors, grouped_gemv, nullptr, hooks);
}

Status moe_imma_forward_prompt_hybrid(const MoeImmaWeights& w, const MoeHybrid& h, const float* x, int n_tok,
                                      float* out, void* workspace, cudaStream_t stream, const MoePhaseHooks& hooks,
                                      int segment_vectors, const GemvImmaTuning& grouped_gemv) {
  return forward(w, x, n_tok, out, workspace, stream, segment_vectors, grouped_gemv, &h, &hooks);
}

}  // namespace kestrel::gpu
