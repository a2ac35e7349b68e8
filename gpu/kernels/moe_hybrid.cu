// moe_hybrid (see moe_hybrid.h): the split of a moe_route routing and the hybrid combine.
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/moe_combine.cuh"
#include "gpu/kernels/moe_hybrid.h"

namespace kestrel::gpu {
namespace {

constexpr int kSplitThreads = 256;
constexpr int kCombineThreads = moe_combine::kThreads;

Status bad(const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "moe hybrid: " + m); }

// One block: thread i (strided) splits entry (t, j) = i of the routing's selections into host_choices, and, per
// active expert not resident, marks its entries' weights −1. r was written by moe_route, the kernel before.
__global__ void __launch_bounds__(kSplitThreads)
    split_kernel(MoeRouting r, int n_entries, const int32_t* __restrict__ resident, ExpertChoice* host_choices) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < n_entries; i += kSplitThreads) {
    const int x = r.ids[i];
    const bool here = resident[x] >= 0;
    ExpertChoice c;
    c.expert = here ? kExpertNotHere : x;
    c.weight = here ? 0.0f : r.weights[i];
    host_choices[i] = c;
  }
  const int n_active = *r.n_active;
  for (int a = tid; a < n_active; a += kSplitThreads) {
    if (resident[r.active_expert[a]] >= 0) continue;
    for (int p = r.active_offset[a]; p < r.active_offset[a + 1]; ++p) r.entry_weight[p] = -1.0f;
  }
}

// moe_hybrid.h step 5, grid (⌈h/256⌉, n_tok): the device entries' weighted sum by ascending expert id (entries of
// weight < 0 are the host's: skipped, their rows never read), + the host partial sum, + the gated shared expert.
template <GgmlType T, bool kShared>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const float* __restrict__ ye, const int32_t* __restrict__ token_entry,
                   const float* __restrict__ entry_weight, int k, const float* __restrict__ host_y,
                   const float* __restrict__ sh, const uint8_t* __restrict__ gate_inp, const float* __restrict__ x,
                   int h, float* __restrict__ out) {
  const int t = static_cast<int>(blockIdx.y);
  const int c = static_cast<int>(blockIdx.x) * kCombineThreads + static_cast<int>(threadIdx.x);
  float s = 0.0f;
  if constexpr (kShared) s = moe_combine::shared_gate<T>(gate_inp, x + static_cast<int64_t>(t) * h, h);
  if (c >= h) return;
  float y = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int e = token_entry[t * k + j];
    const float w = entry_weight[e];
    if (w >= 0.0f) y = __fadd_rn(y, __fmul_rn(ye[static_cast<int64_t>(e) * h + c], w));
  }
  const int64_t at = static_cast<int64_t>(t) * h + c;
  y = __fadd_rn(y, host_y[at]);
  if constexpr (kShared) y = __fadd_rn(y, __fmul_rn(s, sh[at]));
  out[at] = y;
}

}  // namespace

Status moe_hybrid_check(const MoeHybrid& h, int64_t n_expert) {
  if (h.resident == nullptr || h.host_choices == nullptr || h.host_y == nullptr) {
    return bad("the resident map, host_choices or host_y is null");
  }
  if (h.n_resident < 0 || h.n_resident > n_expert) {
    return bad(std::to_string(h.n_resident) + " resident experts of " + std::to_string(n_expert));
  }
  return ok_status();
}

Status moe_hybrid_split(const MoeRouting& r, int n_tok, int k, const MoeHybrid& h, cudaStream_t stream) {
  if (n_tok < 1 || n_tok > kMoeMaxTokens || k < 1 || k > kMoeMaxUsed) {
    return bad("split of " + std::to_string(n_tok) + " tokens of " + std::to_string(k) + " choices");
  }
  split_kernel<<<1, kSplitThreads, 0, stream>>>(r, n_tok * k, h.resident, h.host_choices);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

Status moe_hybrid_combine(const MoeHybridCombine& a, cudaStream_t stream) {
  if (a.ye == nullptr || a.token_entry == nullptr || a.entry_weight == nullptr || a.host_y == nullptr ||
      a.x == nullptr || a.out == nullptr || a.n_tok < 1 || a.h < 1 || a.k < 1) {
    return bad("combine: a null buffer or an empty shape");
  }
  const dim3 grid(static_cast<unsigned>((a.h + kCombineThreads - 1) / kCombineThreads), static_cast<unsigned>(a.n_tok));
  if (a.sh != nullptr) {
    const auto* gate_inp = static_cast<const uint8_t*>(a.shared_gate_inp.data);
    if (gate_inp == nullptr) return bad("combine: a shared expert without its gate");
    const bool launched = dispatch_dequant_type(
        a.shared_gate_inp.type,
        [&](auto tag) {
          constexpr GgmlType T = decltype(tag)::value;
          combine_kernel<T, true><<<grid, kCombineThreads, 0, stream>>>(a.ye, a.token_entry, a.entry_weight, a.k,
                                                                        a.host_y, a.sh, gate_inp, a.x, a.h, a.out);
          return true;
        },
        false);
    if (!launched) {
      return make_error(ErrorCode::kUnsupported,
                        "moe hybrid: ffn_gate_inp_shexp type " + std::string(ggml_type_name(a.shared_gate_inp.type)));
    }
  } else {
    combine_kernel<GgmlType::kF32, false><<<grid, kCombineThreads, 0, stream>>>(
        a.ye, a.token_entry, a.entry_weight, a.k, a.host_y, nullptr, nullptr, a.x, a.h, a.out);
  }
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
