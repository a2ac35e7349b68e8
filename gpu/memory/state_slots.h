// StateSlots: per-session recurrent state on the device, n_slots slots for one model (design.md §3 "State").
//
// One slot holds, per layer of the model, exactly what ref::SessionState holds (core/reference/session_state.h):
//   GDN layer:       s    f32 [Vh][dk][dv]          S_h[i][j] at (h·dk + i)·dv + j   (ref::GdnState::s)
//                    conv f32 [C][K−1]             last K−1 raw (pre-SiLU) inputs per channel, oldest first
//   attention layer: k    f32 [n_ctx][n_kv][hd]    K after k-norm and RoPE        (ref::KvCache::k)
//                    v    f32 [n_ctx][n_kv][hd]    raw V                          (ref::KvCache::v)
// The KV cache is f32 (not f16) so that the GPU path agrees with the reference to f32 rounding; at the 35B-A3B
// shape (10 attention layers, 2 kv heads × 256) that is 40 KiB per token per session.
// All slots live in one cudaMalloc; slot s is one contiguous region (so reset is one memset), each buffer starts
// at a 256-byte boundary. The device keeps, per layer, a table of per-slot pointers (float* [n_slots]) that kernels
// index with a slot id: gdn_table(l) / kv_table(l). Token counts (positions) are not stored here: the caller
// (engine) tracks each session's n_past and passes it to the kernels and to the copy functions.
//
// Ownership and threads: move-only, frees its memory when destroyed (after the caller has synchronized any stream
// using it). The copy functions enqueue on `stream`; download/upload wait for it. Not thread-safe to mutate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"
#include "core/reference/gdn_state.h"
#include "core/reference/session_state.h"

namespace kestrel::gpu {

// Device tables of one GDN layer: s[slot] -> f32 [Vh][dk][dv], conv[slot] -> f32 [C][K−1].
struct GdnSlotTable {
  float* const* s = nullptr;     // device array [n_slots] of device pointers
  float* const* conv = nullptr;  // device array [n_slots]
};

// Device tables of one attention layer: k[slot], v[slot] -> f32 [n_ctx][n_kv][hd].
struct KvSlotTable {
  float* const* k = nullptr;  // device array [n_slots] of device pointers
  float* const* v = nullptr;  // device array [n_slots]
  int n_ctx = 0;
  int n_head_kv = 0;
  int head_dim = 0;
};

class StateSlots {
 public:
  // n_slots slots for a model with `hp`, each with room for n_ctx tokens (1 <= n_ctx, and <= hp.n_ctx_train when
  // that is known). kResourceExhausted (naming the bytes needed and free) when the device cannot hold them.
  // The slots start zeroed.
  static Expected<StateSlots> create(const ModelHparams& hp, int n_ctx, int n_slots);
  // The device bytes create() allocates for these slots (their state; the small pointer tables aside), without
  // allocating; 0 for arguments create() refuses.
  static uint64_t bytes_for(const ModelHparams& hp, int n_ctx, int n_slots);

  StateSlots(StateSlots&& other) noexcept;
  StateSlots& operator=(StateSlots&& other) noexcept;
  StateSlots(const StateSlots&) = delete;
  StateSlots& operator=(const StateSlots&) = delete;
  ~StateSlots();

  int n_slots() const { return n_slots_; }
  int n_ctx() const { return n_ctx_; }
  uint32_t n_layer() const { return static_cast<uint32_t>(kinds_.size()); }
  LayerKind kind(uint32_t layer) const { return kinds_[layer]; }
  const ref::GdnDims& gdn_dims() const { return dims_; }
  uint64_t bytes_per_slot() const { return slot_bytes_; }

  // Tables for model layer `layer`; kInvalidArgument when the layer is of the other kind or out of range.
  Expected<GdnSlotTable> gdn_table(uint32_t layer) const;
  Expected<KvSlotTable> kv_table(uint32_t layer) const;
  // Host-side pointers into one slot (device memory), for tests and the engine's bookkeeping.
  Expected<float*> gdn_s(int slot, uint32_t layer) const;
  Expected<float*> gdn_conv(int slot, uint32_t layer) const;
  Expected<float*> kv_k(int slot, uint32_t layer) const;
  Expected<float*> kv_v(int slot, uint32_t layer) const;

  // Zeroes every byte of the slot (enqueued; returns without waiting).
  Status reset(int slot, cudaStream_t stream);
  // dst := src for a session holding n_used tokens: every GDN buffer and KV rows [0, n_used) (device to device,
  // enqueued; returns without waiting). src == dst is a no-op.
  Status clone(int src, int dst, int n_used, cudaStream_t stream);

  // Copies the slot into `state` in ref::SessionState's layout: every GDN s/conv and, per attention layer, K and V
  // rows [0, n_used) with kv(l).n_used = n_used. The state's token history is left as it is (the slot has none).
  // `state` must come from SessionState::create with the same hparams (n_ctx may differ but must be >= n_used).
  // Waits for `stream`.
  Status download(int slot, int n_used, ref::SessionState& state, cudaStream_t stream) const;
  // The inverse: copies the GDN state and the first kv(l).n_used rows of each attention layer's cache into the
  // slot (all attention layers must agree on n_used, <= this pool's n_ctx). Waits for `stream`.
  Status upload(const ref::SessionState& state, int slot, cudaStream_t stream);

 private:
  StateSlots() = default;
  void release();
  Status check_slot(int slot) const;
  Status check_host_layer(const ref::SessionState& state, uint32_t l) const;
  Status check_layer(uint32_t layer, LayerKind want) const;
  float* at(int slot, uint64_t offset) const;

  int n_slots_ = 0;
  int n_ctx_ = 0;
  int n_head_kv_ = 0;
  int head_dim_ = 0;
  ref::GdnDims dims_;
  std::vector<LayerKind> kinds_;
  // Per layer, byte offsets inside a slot: GDN (a = s, b = conv) or attention (a = k, b = v).
  std::vector<uint64_t> off_a_, off_b_;
  uint64_t gdn_s_floats_ = 0, gdn_conv_floats_ = 0, kv_floats_ = 0;  // per buffer
  uint64_t slot_bytes_ = 0;
  uint8_t* base_ = nullptr;   // device, n_slots · slot_bytes
  float** tables_ = nullptr;  // device, [n_layer][2][n_slots]
};

}  // namespace kestrel::gpu
