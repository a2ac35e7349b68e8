// moe_forward and moe_expert_groups (see moe_experts.h).
//
// Grouped expert kernel, grid (⌈rows/4⌉, max_active = min(E, n_tok·k)), 4 warps: block (x, a) takes active expert
// a (blocks past *n_active return at once) and warp w row 4x + w of that expert's matrix (of both gate and up in
// the gate/up pass). The warp walks the row in chunks (2048 elements, 2 KiB of plain types), each first copied raw into
// the warp's slice of shared memory with coalesced 16-byte loads (streaming hint; as gemv.cu), then in groups of 8
// consecutive elements (lane l: groups l, l + 32, ...): it dequantizes each group once (scale decoded once per group,
// each value bit-identical to core's dequantize_row) and multiplies it into the f32 accumulators of up to 8 of the
// expert's entries at a time (more entries: the row is walked again, from L1/L2), so each expert row is read from
// memory once for all its tokens. A fixed butterfly sums the lanes. The gate/up pass writes h[entry] = silu(gate·x) ·
// (up·x), the down pass ye[entry] = down·h[entry]. The shared expert runs through the same kernel as one expert (stride
// 0) with every token as its entries, in one extra grid-y slot of the routed launch when its type matches (else in a
// launch of its own). Combine, grid (⌈H/256⌉, n_tok): out[t] = Σ over t's entries by ascending expert id of ye·w (from
// 0, as the reference), then + sigmoid(shared gate logit, computed in each block) · shared output.
// moe_expert_groups runs the same two passes over groups of a list (Groups::active_end: a group's entries need not
// reach the next group's; Job::out_row: the down pass writes each entry's row where its caller's combine reads it).
#include <algorithm>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/dequant_group.cuh"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/moe_combine.cuh"
#include "gpu/kernels/moe_experts.h"
#include "gpu/kernels/moe_hybrid.h"
#include "gpu/kernels/stage_row.cuh"
#include "gpu/memory/scratch_carve.h"

namespace kestrel::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kGroup = kDequantGroup;  // elements a lane decodes at once (never crosses a block or a sub-block scale)
constexpr int kEntryTile = 8;          // entries accumulated per pass over a row
constexpr int kCombineThreads = moe_combine::kThreads;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// One stack of expert matrices, as the kernel sees it.
struct Stack {
  const uint8_t* data;
  int64_t expert_bytes;  // 0 for the shared expert
  int64_t row_bytes;
  int n_cols;
  int n_rows;
};

// Which entries each active expert owns.
struct Groups {
  const int32_t* n_active;       // null: one expert (index 0) whose entries are the tokens 0 .. n_tok − 1
  const int32_t* active_expert;  // [max_active]
  const int32_t* active_offset;  // [max_active + 1]
  const int32_t* entry_token;    // [entries]
  int n_tok;
  const int32_t* resident = nullptr;    // hybrid layers: expert id → index in the compact stack, < 0: not here (the
                                        // block returns); null: the stack holds every expert
  const int32_t* active_end = nullptr;  // [max_active]: one past each slot's last entry; null: active_offset[slot + 1]
};

std::string tname(GgmlType t) { return std::string(ggml_type_name(t)); }

__device__ __forceinline__ float silu_rn(float x) { return __fmul_rn(x, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)))); }

// Shared-memory geometry of one staged chunk of type T: 2048 elements of the block types (a whole row of the 35B-A3B
// gate/up experts in one step, at most 2176 bytes), 2 KiB of the plain types.
template <GgmlType T>
struct ChunkShape {
  using D = Dequant<T>;
  static constexpr int kElems = D::kBlockElems == 1 ? 2048 / static_cast<int>(sizeof(typename D::Block)) : 2048;
  static_assert(kElems % D::kBlockElems == 0 && kElems % 256 == 0);
  static constexpr int kBytes = kElems / D::kBlockElems * static_cast<int>(sizeof(typename D::Block));
  static constexpr int kUnits = stage_row::units_for(kBytes);
  static constexpr int kUnitsPerLane = (kUnits + 31) / 32;
};

// One pass over a set of experts: kGateUp: a = gate, b = up, x = f32 [n_tok, n_cols] indexed by entry_token,
// out = h f32 [entries, n_rows]. !kGateUp: a = down (b unused), x = h f32 [entries, n_cols] indexed by entry,
// out = ye f32 [entries, n_rows].
struct Job {
  Stack a;
  Stack b;
  Groups gr;
  const float* x;
  float* out;
  const int32_t* out_row = nullptr;  // entry → its row of out; null: the entry itself
};

// Grid y: the routed job's active-expert slots, plus (when j1_slot >= 0) one slot j1_slot for a second job (the
// shared expert, when its types match), so both run in one launch.
template <GgmlType T, bool kGateUp>
__global__ void __launch_bounds__(kThreads) grouped_kernel(Job j0, Job j1, int j1_slot) {
  using Shape = ChunkShape<T>;
  __shared__ uint4 stage_a[kWarps][Shape::kUnits];
  __shared__ uint4 stage_b[kWarps][kGateUp ? Shape::kUnits : 1];
  const int slot = static_cast<int>(blockIdx.y);
  // Field by field (a select of whole parameter structs would be copied to the stack).
  const bool s2 = slot == j1_slot;
  const Stack a{s2 ? j1.a.data : j0.a.data, s2 ? j1.a.expert_bytes : j0.a.expert_bytes,
                s2 ? j1.a.row_bytes : j0.a.row_bytes, s2 ? j1.a.n_cols : j0.a.n_cols, s2 ? j1.a.n_rows : j0.a.n_rows};
  const Stack b{s2 ? j1.b.data : j0.b.data, s2 ? j1.b.expert_bytes : j0.b.expert_bytes,
                s2 ? j1.b.row_bytes : j0.b.row_bytes, s2 ? j1.b.n_cols : j0.b.n_cols, s2 ? j1.b.n_rows : j0.b.n_rows};
  const Groups gr{s2 ? j1.gr.n_active : j0.gr.n_active,
                  s2 ? j1.gr.active_expert : j0.gr.active_expert,
                  s2 ? j1.gr.active_offset : j0.gr.active_offset,
                  s2 ? j1.gr.entry_token : j0.gr.entry_token,
                  s2 ? j1.gr.n_tok : j0.gr.n_tok,
                  s2 ? j1.gr.resident : j0.gr.resident,
                  s2 ? j1.gr.active_end : j0.gr.active_end};
  const float* __restrict__ x = s2 ? j1.x : j0.x;
  float* __restrict__ out = s2 ? j1.out : j0.out;
  const int32_t* __restrict__ out_row = s2 ? j1.out_row : j0.out_row;
  int expert = 0;
  int first = 0;
  int last = gr.n_tok;
  if (gr.n_active != nullptr) {
    if (slot >= *gr.n_active) return;  // whole block
    expert = gr.active_expert[slot];
    if (gr.resident != nullptr) {
      expert = gr.resident[expert];
      if (expert < 0) return;  // whole block: a host expert
    }
    first = gr.active_offset[slot];
    last = gr.active_end != nullptr ? gr.active_end[slot] : gr.active_offset[slot + 1];
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row = static_cast<int>(blockIdx.x) * kWarps + warp;
  if (row >= a.n_rows) return;  // whole warp; no barrier follows
  const uint8_t* ra = a.data + expert * a.expert_bytes + static_cast<int64_t>(row) * a.row_bytes;
  const uint8_t* rb = kGateUp ? b.data + expert * b.expert_bytes + static_cast<int64_t>(row) * b.row_bytes : nullptr;
  const int n_cols = a.n_cols;
  // Groups start at multiples of 8 elements, so with this every group's x is 16-byte aligned.
  const bool x_vec4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 && n_cols % 4 == 0;

  for (int c0 = first; c0 < last; c0 += kEntryTile) {
    const int nv = min(kEntryTile, last - c0);
    const float* xr[kEntryTile];
#pragma unroll
    for (int v = 0; v < kEntryTile; ++v) {
      const int entry = c0 + (v < nv ? v : 0);
      int xrow = entry;
      if (kGateUp) xrow = gr.n_active != nullptr ? gr.entry_token[entry] : entry;
      xr[v] = x + static_cast<int64_t>(xrow) * n_cols;
    }
    float acc_a[kEntryTile];
    float acc_b[kEntryTile];
#pragma unroll
    for (int v = 0; v < kEntryTile; ++v) {
      acc_a[v] = 0.0f;
      acc_b[v] = 0.0f;
    }
    for (int base = 0; base < n_cols; base += Shape::kElems) {
      const int elems = min(Shape::kElems, n_cols - base);
      const uint8_t* ca = stage_row::stage_chunk<T, Shape::kUnitsPerLane>(ra, base, elems, stage_a[warp], lane);
      const uint8_t* cb =
          kGateUp ? stage_row::stage_chunk<T, Shape::kUnitsPerLane>(rb, base, elems, stage_b[warp], lane) : nullptr;
      for (int e0 = kGroup * lane; e0 < elems; e0 += kGroup * 32) {
        const int n = min(kGroup, elems - e0);
        float wa[kGroup];
        float wb[kGroup];
        dq_group_weights<T>(reinterpret_cast<const typename Dequant<T>::Block*>(ca), e0, n, wa);
        if constexpr (kGateUp) dq_group_weights<T>(reinterpret_cast<const typename Dequant<T>::Block*>(cb), e0, n, wb);
#pragma unroll
        for (int v = 0; v < kEntryTile; ++v) {
          if (v < nv) {
            float xv[kGroup];
            dq_load_x(xr[v] + base + e0, n, x_vec4, xv);
#pragma unroll
            for (int j = 0; j < kGroup; ++j) {
              acc_a[v] = fmaf(wa[j], xv[j], acc_a[v]);  // wa[j] = xv[j] = 0 past n
              if constexpr (kGateUp) acc_b[v] = fmaf(wb[j], xv[j], acc_b[v]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int v = 0; v < kEntryTile; ++v) {
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        acc_a[v] += __shfl_xor_sync(kFullMask, acc_a[v], off);
        if constexpr (kGateUp) acc_b[v] += __shfl_xor_sync(kFullMask, acc_b[v], off);
      }
    }
#pragma unroll
    for (int v = 0; v < kEntryTile; ++v) {
      if (v < nv && lane == v) {
        const float val = kGateUp ? __fmul_rn(silu_rn(acc_a[v]), acc_b[v]) : acc_a[v];
        const int at = out_row != nullptr ? out_row[c0 + v] : c0 + v;
        out[static_cast<int64_t>(at) * a.n_rows + row] = val;
      }
    }
  }
}

// out[t] = Σ_j ye[token_entry[t][j]] · entry_weight[...], plus with kShared sigmoid(gate_inp · x[t]) · sh[t]; the
// shared gate logit (a dot product of H elements of type T) is computed by each block: 256 lane-strided partial
// sums, a butterfly per warp, then the 8 warp sums in order.
template <GgmlType T, bool kShared>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const float* __restrict__ ye, const int32_t* __restrict__ token_entry,
                   const float* __restrict__ entry_weight, int k, const float* __restrict__ sh,
                   const uint8_t* __restrict__ gate_inp, const float* __restrict__ x, int h, float* __restrict__ out) {
  const int t = static_cast<int>(blockIdx.y);
  const int c = static_cast<int>(blockIdx.x) * kCombineThreads + static_cast<int>(threadIdx.x);
  float s = 0.0f;
  if constexpr (kShared) s = moe_combine::shared_gate<T>(gate_inp, x + static_cast<int64_t>(t) * h, h);
  if (c >= h) return;
  float y = moe_combine::routed_sum(ye, token_entry, entry_weight, k, t, c, h);
  if constexpr (kShared) y = __fadd_rn(y, __fmul_rn(s, sh[static_cast<int64_t>(t) * h + c]));
  out[static_cast<int64_t>(t) * h + c] = y;
}

Stack stack_of(const DeviceExpertsView& v) {
  const int64_t rb = static_cast<int64_t>(*ggml_row_bytes(v.type, static_cast<uint64_t>(v.n_cols)));
  return Stack{static_cast<const uint8_t*>(v.data), rb * v.n_rows, rb, static_cast<int>(v.n_cols),
               static_cast<int>(v.n_rows)};
}

Stack stack_of(const DeviceMatrixView& v) {
  const int64_t rb = static_cast<int64_t>(*ggml_row_bytes(v.type, static_cast<uint64_t>(v.n_cols)));
  return Stack{static_cast<const uint8_t*>(v.data), 0, rb, static_cast<int>(v.n_cols), static_cast<int>(v.n_rows)};
}

// Enqueues one grouped pass: job j0 over `slots` slots, and job j1 (if non-null) in one extra slot.
Status launch_grouped(GgmlType type, bool gate_up, const Job& j0, int slots, const Job* j1, cudaStream_t stream) {
  int rows = j0.a.n_rows;
  if (j1 != nullptr) rows = std::max(rows, j1->a.n_rows);
  const int j1_slot = j1 != nullptr ? slots : -1;
  const Job second = j1 != nullptr ? *j1 : j0;
  const dim3 grid(static_cast<unsigned>((rows + kWarps - 1) / kWarps),
                  static_cast<unsigned>(slots + (j1 != nullptr ? 1 : 0)));
  const bool launched = dispatch_dequant_type(
      type,
      [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if (gate_up) {
          grouped_kernel<T, true><<<grid, kThreads, 0, stream>>>(j0, second, j1_slot);
        } else {
          grouped_kernel<T, false><<<grid, kThreads, 0, stream>>>(j0, second, j1_slot);
        }
        return true;
      },
      false);
  if (!launched) {
    return make_error(ErrorCode::kUnsupported, std::string("moe: no kernel for ") + tname(type));
  }
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

// Workspace pieces, in order.
struct Layout {
  float* logits;  // f32 [n_tok, E]
  void* routing;  // moe_routing_bytes
  float* h;       // f32 [n_tok·k, I_e]
  float* ye;      // f32 [n_tok·k, H]
  float* sh_h;    // f32 [n_tok, I_s]
  float* sh_y;    // f32 [n_tok, H]
  size_t bytes;
};

Layout layout_of(const MoeDeviceWeights& w, int n_tok, void* base) {
  const size_t T = static_cast<size_t>(n_tok), E = static_cast<size_t>(w.router.n_rows);
  const size_t H = static_cast<size_t>(w.router.n_cols), I = static_cast<size_t>(w.gate_exps.n_rows);
  const size_t k = static_cast<size_t>(w.n_expert_used);
  const size_t Is = w.has_shared_expert() ? static_cast<size_t>(w.gate_shexp.n_rows) : 0;
  ScratchCarve c(base);
  Layout l{};
  l.logits = c.take<float>(T * E * 4);
  l.routing = c.take(moe_routing_bytes(n_tok, static_cast<int>(E), static_cast<int>(k)));
  l.h = c.take<float>(T * k * I * 4);
  l.ye = c.take<float>(T * k * H * 4);
  l.sh_h = c.take<float>(T * Is * 4);
  l.sh_y = c.take<float>(T * H * 4);
  l.bytes = c.bytes();
  return l;
}

std::string shape(int64_t a, int64_t b) { return "{" + std::to_string(a) + ", " + std::to_string(b) + "}"; }

Status check_matrix(const DeviceMatrixView& m, const char* name, int64_t n_cols, int64_t n_rows) {
  if (m.data == nullptr || m.n_cols != n_cols || m.n_rows != n_rows) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string("moe: ") + name + " has shape " + shape(m.n_cols, m.n_rows) +
                          (m.data == nullptr ? " and no data" : "") + ", expected " + shape(n_cols, n_rows));
  }
  if (!has_dequant(m.type) || !ggml_row_bytes(m.type, static_cast<uint64_t>(n_cols))) {
    return make_error(ErrorCode::kUnsupported, std::string("moe: ") + name + " type " + tname(m.type) +
                                                   " is not supported with " + std::to_string(n_cols) + " columns");
  }
  return ok_status();
}

// moe_check_weights for stacks of `stack_experts` experts (E, or a hybrid layer's resident count; 0: null data
// allowed).
Status check_weights(const MoeDeviceWeights& w, int64_t stack_experts) {
  const int64_t H = w.router.n_cols, E = w.router.n_rows, I = w.gate_exps.n_rows;
  KESTREL_TRY(check_matrix(w.router, "ffn_gate_inp", H, E));
  if (!gemv_supports(w.router.type)) {
    return make_error(ErrorCode::kUnsupported, std::string("moe: router type ") + tname(w.router.type));
  }
  if (E < 1 || E > kMoeMaxExperts || w.n_expert_used < 1 || w.n_expert_used > E || w.n_expert_used > kMoeMaxUsed) {
    return make_error(ErrorCode::kInvalidArgument, "moe: " + std::to_string(E) + " experts, " +
                                                       std::to_string(w.n_expert_used) +
                                                       " used: need 1 <= used <= min(E, 32), E <= 1024");
  }
  auto check_stack = [&](const DeviceExpertsView& s, const char* name, int64_t n_cols, int64_t n_rows) -> Status {
    if ((s.data == nullptr && stack_experts > 0) || s.n_cols != n_cols || s.n_rows != n_rows ||
        s.n_expert != stack_experts) {
      return make_error(ErrorCode::kInvalidArgument,
                        std::string("moe: ") + name + " has shape {" + std::to_string(s.n_cols) + ", " +
                            std::to_string(s.n_rows) + ", " + std::to_string(s.n_expert) + "}" +
                            (s.data == nullptr ? " and no data" : "") + ", expected {" + std::to_string(n_cols) + ", " +
                            std::to_string(n_rows) + ", " + std::to_string(stack_experts) + "}");
    }
    if (!has_dequant(s.type) || !ggml_row_bytes(s.type, static_cast<uint64_t>(n_cols))) {
      return make_error(ErrorCode::kUnsupported, std::string("moe: ") + name + " type " + tname(s.type) +
                                                     " is not supported with " + std::to_string(n_cols) + " columns");
    }
    return ok_status();
  };
  KESTREL_TRY(check_stack(w.gate_exps, "ffn_gate_exps", H, I));
  KESTREL_TRY(check_stack(w.up_exps, "ffn_up_exps", H, I));
  KESTREL_TRY(check_stack(w.down_exps, "ffn_down_exps", I, H));
  if (w.gate_exps.type != w.up_exps.type) {
    return make_error(ErrorCode::kUnsupported, std::string("moe: ffn_gate_exps (") + tname(w.gate_exps.type) +
                                                   ") and ffn_up_exps (" + tname(w.up_exps.type) +
                                                   ") must share a type");
  }
  if (w.has_shared_expert()) {
    const int64_t Is = w.gate_shexp.n_rows;
    KESTREL_TRY(check_matrix(w.shared_gate_inp, "ffn_gate_inp_shexp", H, 1));
    if (!gemv_supports(w.shared_gate_inp.type)) {
      return make_error(ErrorCode::kUnsupported,
                        std::string("moe: ffn_gate_inp_shexp type ") + tname(w.shared_gate_inp.type));
    }
    KESTREL_TRY(check_matrix(w.gate_shexp, "ffn_gate_shexp", H, Is));
    KESTREL_TRY(check_matrix(w.up_shexp, "ffn_up_shexp", H, Is));
    KESTREL_TRY(check_matrix(w.down_shexp, "ffn_down_shexp", Is, H));
    if (w.gate_shexp.type != w.up_shexp.type) {
      return make_error(ErrorCode::kUnsupported, "moe: ffn_gate_shexp and ffn_up_shexp must share a type");
    }
  }
  return ok_status();
}

}  // namespace

bool moe_supports(GgmlType type) { return has_dequant(type); }

Status moe_check_weights(const MoeDeviceWeights& w) { return check_weights(w, w.router.n_rows); }

size_t moe_workspace_bytes(const MoeDeviceWeights& w, int n_tok) {
  if (n_tok < 1) return 0;
  return layout_of(w, n_tok, nullptr).bytes;
}

namespace {

// moe_forward, and with `h` moe_forward_hybrid (moe_hybrid.h's steps: the split after the routing, the hooks, the
// resident experts through the map, the hybrid combine).
Status forward(const MoeDeviceWeights& w, const float* x, int n_tok, float* out, void* workspace, cudaStream_t stream,
               MoeLaunchInfo* info, const MoeHybrid* h, const MoePhaseHooks* hooks) {
  KESTREL_TRY(h != nullptr ? check_weights(w, h->n_resident) : moe_check_weights(w));
  if (h != nullptr) KESTREL_TRY(moe_hybrid_check(*h, w.router.n_rows));
  if (n_tok < 1 || n_tok > kMoeMaxTokens) {
    return make_error(ErrorCode::kInvalidArgument,
                      "moe: n_tok " + std::to_string(n_tok) + " outside [1, " + std::to_string(kMoeMaxTokens) + "]");
  }
  if (x == nullptr || out == nullptr || workspace == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "moe: x, out or workspace is null");
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return make_error(ErrorCode::kInvalidArgument, "moe: x and workspace must be 16-byte aligned");
  }
  const int E = static_cast<int>(w.router.n_rows);
  const int H = static_cast<int>(w.router.n_cols);
  const int k = w.n_expert_used;
  const Layout l = layout_of(w, n_tok, workspace);
  const MoeRouting r = moe_routing_carve(l.routing, n_tok, E, k);
  const int max_active = std::min(E, n_tok * k);
  int launches = 0;

  KESTREL_TRY(gemv(w.router, x, n_tok, l.logits, stream));
  ++launches;
  KESTREL_TRY(moe_route(l.logits, n_tok, E, k, r, stream));
  ++launches;
  if (h != nullptr) {
    KESTREL_TRY(moe_hybrid_split(r, n_tok, k, *h, stream));
    ++launches;
    if (hooks != nullptr && hooks->after_route) KESTREL_TRY(hooks->after_route());
  }
  // A hybrid layer with no resident expert launches the shared expert alone (nothing at all without one).
  const bool routed_on_device = h == nullptr || h->n_resident > 0;
  Groups routed{r.n_active, r.active_expert, r.active_offset, r.entry_token, n_tok};
  if (h != nullptr) routed.resident = h->resident;
  const Stack gate = stack_of(w.gate_exps), up = stack_of(w.up_exps), down = stack_of(w.down_exps);
  const Job routed_gate_up{gate, up, routed, x, l.h};
  const Job routed_down{down, down, routed, l.h, l.ye};
  if (!w.has_shared_expert()) {
    if (routed_on_device) {
      KESTREL_TRY(launch_grouped(w.gate_exps.type, true, routed_gate_up, max_active, nullptr, stream));
      KESTREL_TRY(launch_grouped(w.down_exps.type, false, routed_down, max_active, nullptr, stream));
      launches += 2;
    }
  } else {
    // The shared expert is one more "expert" whose entries are all the tokens; it joins the routed launch of a
    // pass when its type matches, else it gets its own launch.
    const Groups all{nullptr, nullptr, nullptr, nullptr, n_tok};
    const Stack sg = stack_of(w.gate_shexp), su = stack_of(w.up_shexp), sd = stack_of(w.down_shexp);
    const Job shared_gate_up{sg, su, all, x, l.sh_h};
    const Job shared_down{sd, sd, all, l.sh_h, l.sh_y};
    if (!routed_on_device) {
      KESTREL_TRY(launch_grouped(w.gate_shexp.type, true, shared_gate_up, 1, nullptr, stream));
      KESTREL_TRY(launch_grouped(w.down_shexp.type, false, shared_down, 1, nullptr, stream));
      launches += 2;
    } else {
      if (w.gate_shexp.type == w.gate_exps.type) {
        KESTREL_TRY(launch_grouped(w.gate_exps.type, true, routed_gate_up, max_active, &shared_gate_up, stream));
        launches += 1;
      } else {
        KESTREL_TRY(launch_grouped(w.gate_exps.type, true, routed_gate_up, max_active, nullptr, stream));
        KESTREL_TRY(launch_grouped(w.gate_shexp.type, true, shared_gate_up, 1, nullptr, stream));
        launches += 2;
      }
      if (w.down_shexp.type == w.down_exps.type) {
        KESTREL_TRY(launch_grouped(w.down_exps.type, false, routed_down, max_active, &shared_down, stream));
        launches += 1;
      } else {
        KESTREL_TRY(launch_grouped(w.down_exps.type, false, routed_down, max_active, nullptr, stream));
        KESTREL_TRY(launch_grouped(w.down_shexp.type, false, shared_down, 1, nullptr, stream));
        launches += 2;
      }
    }
  }
  if (h != nullptr) {
    if (hooks != nullptr && hooks->before_combine) KESTREL_TRY(hooks->before_combine());
    MoeHybridCombine c;
    c.ye = l.ye;
    c.token_entry = r.token_entry;
    c.entry_weight = r.entry_weight;
    c.k = k;
    c.host_y = h->host_y;
    c.sh = w.has_shared_expert() ? l.sh_y : nullptr;
    c.shared_gate_inp = w.shared_gate_inp;
    c.x = x;
    c.n_tok = n_tok;
    c.h = H;
    c.out = out;
    KESTREL_TRY(moe_hybrid_combine(c, stream));
    ++launches;
    if (info != nullptr) {
      info->launches = launches;
      info->routing = r;
    }
    return ok_status();
  }
  const dim3 grid(static_cast<unsigned>((H + kCombineThreads - 1) / kCombineThreads), static_cast<unsigned>(n_tok));
  if (w.has_shared_expert()) {
    const auto* gate_inp = static_cast<const uint8_t*>(w.shared_gate_inp.data);
    const bool launched = dispatch_dequant_type(
        w.shared_gate_inp.type,
        [&](auto tag) {
          constexpr GgmlType T = decltype(tag)::value;
          combine_kernel<T, true><<<grid, kCombineThreads, 0, stream>>>(l.ye, r.token_entry, r.entry_weight, k, l.sh_y,
                                                                        gate_inp, x, H, out);
          return true;
        },
        false);
    if (!launched) return make_error(ErrorCode::kUnsupported, "moe: ffn_gate_inp_shexp type");
  } else {
    combine_kernel<GgmlType::kF32, false>
        <<<grid, kCombineThreads, 0, stream>>>(l.ye, r.token_entry, r.entry_weight, k, nullptr, nullptr, x, H, out);
  }
  KESTREL_CUDA_TRY(cudaGetLastError());
  ++launches;
  if (info != nullptr) {
    info->launches = launches;
    info->routing = r;
  }
  return ok_status();
}

}  // namespace

Status moe_expert_groups(const MoeExpertGroups& g, cudaStream_t stream) {
  const MoeBusStacks& st = g.stacks;
  const int64_t H = st.gate.n_cols, I = st.gate.n_rows, E = st.gate.n_expert;
  if (st.gate.data == nullptr || st.up.data == nullptr || st.down.data == nullptr || g.n_groups == nullptr ||
      g.expert == nullptr || g.first == nullptr || g.end == nullptr || g.entry_token == nullptr ||
      g.out_entry == nullptr || g.x == nullptr || g.h == nullptr || g.ye == nullptr || g.max_groups < 1 ||
      g.n_tok < 1 || H < 1 || I < 1 || E < 1) {
    return make_error(ErrorCode::kInvalidArgument, "moe expert groups: a null table or buffer, or an empty shape");
  }
  if (st.up.n_cols != H || st.up.n_rows != I || st.up.n_expert != E || st.down.n_cols != I || st.down.n_rows != H ||
      st.down.n_expert != E || st.gate.type != st.up.type) {
    return make_error(ErrorCode::kInvalidArgument,
                      "moe expert groups: the stacks are not gate/up {H, I, E} of one type and down {I, H, E}");
  }
  if (!has_dequant(st.gate.type) || !has_dequant(st.down.type) ||
      !ggml_row_bytes(st.gate.type, static_cast<uint64_t>(H)) ||
      !ggml_row_bytes(st.down.type, static_cast<uint64_t>(I))) {
    return make_error(ErrorCode::kUnsupported, "moe expert groups: types " + tname(st.gate.type) + " / " +
                                                   tname(st.down.type) + " at these shapes");
  }
  Groups gr{g.n_groups, g.expert, g.first, g.entry_token, g.n_tok};
  gr.active_end = g.end;
  const Job gate_up{stack_of(st.gate), stack_of(st.up), gr, g.x, g.h};
  const Job down{stack_of(st.down), stack_of(st.down), gr, g.h, g.ye, g.out_entry};
  KESTREL_TRY(launch_grouped(st.gate.type, true, gate_up, g.max_groups, nullptr, stream));
  return launch_grouped(st.down.type, false, down, g.max_groups, nullptr, stream);
}

Status moe_forward(const MoeDeviceWeights& w, const float* x, int n_tok, float* out, void* workspace,
                   cudaStream_t stream, MoeLaunchInfo* info) {
  return forward(w, x, n_tok, out, workspace, stream, info, nullptr, nullptr);
}

Status moe_forward_hybrid(const MoeDeviceWeights& w, const MoeHybrid& h, const float* x, int n_tok, float* out,
                          void* workspace, cudaStream_t stream, const MoePhaseHooks& hooks, MoeLaunchInfo* info) {
  return forward(w, x, n_tok, out, workspace, stream, info, &h, &hooks);
}

}  // namespace kestrel::gpu
