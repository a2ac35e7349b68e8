// StateSlots: per-session recurrent state and the paged KV cache on the device, for one model (design.md §3 "State").
//
// Two parts, holding together exactly what ref::SessionState holds (core/reference/session_state.h):
//
// GDN state, per slot (fixed size, so each of the n_slots slots has its own, one contiguous region: reset is one
// memset). Per GDN layer:
//   s    f32 [Vh][dk][dv]   S_h[i][j] at (h·dk + i)·dv + j   (ref::GdnState::s)
//   conv f32 [C][K−1]       last K−1 raw (pre-SiLU) inputs per channel, oldest first
// The device keeps, per layer, a table of per-slot pointers (float* [n_slots]) that kernels index with a slot id.
//
// KV cache, in pages shared by all slots (one allocation of n_pages pages). A page holds page_size consecutive
// positions of one session for every attention layer: per attention layer a (in layer order) K then V,
//   k f32 [page_size][n_kv][hd]   K after k-norm and RoPE   (rows of ref::KvCache::k)
//   v f32 [page_size][n_kv][hd]   raw V                     (rows of ref::KvCache::v)
// at floats (2a + 0 / 1) · page_size · n_kv · hd from the page's start, pages page_stride floats apart. A slot holding
// n tokens owns ceil(n / page_size) pages (KvPageAllocator: host bookkeeping), so a session's cache grows with its
// tokens instead of every slot reserving the largest context. Each slot has a device page table (int32
// [max_pages], its page ids in position order, max_pages = ceil(n_ctx / page_size)) that the attention kernels
// follow (KvPageTable, gpu/kernels/attention_decode.h). All attention layers share the page geometry and the table.
// The KV cache is f32 (not f16) so that the GPU path agrees with the reference to f32 rounding; at the 35B-A3B shape
// (10 attention layers, 2 kv heads × 256) that is 40 KiB per token, 10 MiB per page of 256.
//
// Host and device page tables: reserve() adds pages on the host only; the device entry of a page is written by the
// forward pass with the first position it appends there (kv_page_publish, one launch per pass, from the pass's
// upload block), and clone() / upload() write the whole table of the slot they fill. So the device table holds
// every page a slot has written, which is all the kernels read. Token counts (positions) are not stored here: the
// engine tracks each session's n_past and passes it to the kernels and to the copy functions.
//
// Ownership and threads: move-only, frees its memory when destroyed (after the caller has synchronized any stream
// using it). The copy functions enqueue on `stream`; download/upload wait for it. Not thread-safe to mutate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"
#include "core/reference/gdn_state.h"
#include "core/reference/session_state.h"
#include "gpu/memory/kv_page_allocator.h"

namespace kestrel::gpu {

// Device tables of one GDN layer: s[slot] -> f32 [Vh][dk][dv], conv[slot] -> f32 [C][K−1].
struct GdnSlotTable {
  float* const* s = nullptr;     // device array [n_slots] of device pointers
  float* const* conv = nullptr;  // device array [n_slots]
};

// One attention layer's view of the KV page pool: the K (V) rows of position p, kv head j, of slot s are at
//   k + pages[s · max_pages + p / page_size] · page_stride + ((p % page_size) · n_head_kv + j) · head_dim.
struct KvPageTable {
  float* k = nullptr;        // device: this layer's K rows of page 0
  float* v = nullptr;        // device: this layer's V rows of page 0
  int32_t* pages = nullptr;  // device int32 [n_slots][max_pages]: each slot's page ids in position order
  int64_t page_stride = 0;   // floats from a page to the next (>= page_size · n_head_kv · head_dim)
  int page_size = 0;         // positions per page, a power of two
  int max_pages = 0;         // entries per slot
  int n_head_kv = 0;
  int head_dim = 0;

  // The most positions one slot's table addresses.
  int64_t capacity() const { return static_cast<int64_t>(max_pages) * page_size; }
};

// The KV page pool's geometry.
struct KvPoolConfig {
  int page_size = 256;  // positions per page: a power of two (the kernels find a position's page with a shift)
  int64_t n_pages = 0;  // pages in the pool (>= 1 when the model has attention layers; ignored when it has none)
};

class StateSlots {
 public:
  // n_slots slots for a model with `hp`, each holding up to n_ctx tokens (1 <= n_ctx, and <= hp.n_ctx_train when
  // that is known), their KV in a pool of kv.n_pages pages. kResourceExhausted (naming the bytes needed and free)
  // when the device cannot hold them. The GDN state starts zeroed; slots start with no pages.
  static Expected<StateSlots> create(const ModelHparams& hp, int n_ctx, int n_slots, const KvPoolConfig& kv);

  // Bytes of one slot's GDN state and of one KV page (0 for a model without attention layers), for sizing the pool.
  static uint64_t gdn_bytes_per_slot(const ModelHparams& hp);
  static uint64_t kv_bytes_per_page(const ModelHparams& hp, int page_size);
  // The device bytes create(hp, n_ctx, n_slots, kv) allocates (GDN state, KV pages, slot tables), without allocating;
  // 0 for arguments create() refuses.
  static uint64_t bytes_for(const ModelHparams& hp, int n_ctx, int n_slots, const KvPoolConfig& kv);

  StateSlots(StateSlots&& other) noexcept;
  StateSlots& operator=(StateSlots&& other) noexcept;
  StateSlots(const StateSlots&) = delete;
  StateSlots& operator=(const StateSlots&) = delete;
  ~StateSlots();

  int n_slots() const { return n_slots_; }
  int n_ctx() const { return n_ctx_; }  // the most tokens one slot holds
  uint32_t n_layer() const { return static_cast<uint32_t>(kinds_.size()); }
  LayerKind kind(uint32_t layer) const { return kinds_[layer]; }
  const ref::GdnDims& gdn_dims() const { return dims_; }
  bool has_kv() const { return n_attn_ > 0; }
  int page_size() const { return pages_.page_size(); }
  int64_t n_pages() const { return pages_.n_pages(); }
  int64_t free_pages() const { return pages_.free_pages(); }
  uint64_t bytes_per_page() const { return page_bytes_; }
  uint64_t gdn_bytes() const { return slot_bytes_ * static_cast<uint64_t>(n_slots_); }         // every slot's GDN state
  uint64_t kv_bytes() const { return page_bytes_ * static_cast<uint64_t>(pages_.n_pages()); }  // the page pool
  uint64_t device_bytes() const { return gdn_bytes() + kv_bytes() + table_bytes_; }            // with the device tables

  // Tables for model layer `layer`; kInvalidArgument when the layer is of the other kind or out of range.
  Expected<GdnSlotTable> gdn_table(uint32_t layer) const;
  Expected<KvPageTable> kv_table(uint32_t layer) const;
  // The page table alone (k and v null), for kv_page_publish; kFailedPrecondition without attention layers.
  Expected<KvPageTable> page_table() const;
  // Host-side pointers (device memory), for tests and the engine's bookkeeping: a slot's GDN buffers, and page
  // `page`'s K / V rows of attention layer `layer` (f32 [page_size][n_kv][hd]).
  Expected<float*> gdn_s(int slot, uint32_t layer) const;
  Expected<float*> gdn_conv(int slot, uint32_t layer) const;
  Expected<float*> kv_k(int32_t page, uint32_t layer) const;
  Expected<float*> kv_v(int32_t page, uint32_t layer) const;

  // The slot's pages in position order (host bookkeeping), and the page holding `position` (kOutOfRange when the
  // slot holds none for it; 0 for a model without attention layers, which has no pages).
  std::span<const int32_t> pages(int slot) const { return pages_.pages(slot); }
  Expected<int32_t> page_at(int slot, int64_t position) const;
  // Gives the slot the pages it lacks to hold n_tokens tokens (host only; see the head comment for when the device
  // table learns them). kResourceExhausted, naming the tokens and bytes asked for and free, leaves every slot as it
  // was; kOutOfRange past n_ctx.
  Status reserve(int slot, int64_t n_tokens);
  // Returns the slot's pages to the pool (host only; their contents stay until another slot writes them).
  void release(int slot);
  // Copies the slot's page list into its device page table (enqueued; returns without waiting).
  Status write_page_table(int slot, cudaStream_t stream);

  // Zeroes the slot's GDN state and releases its pages (enqueued; returns without waiting).
  Status reset(int slot, cudaStream_t stream);
  // dst := src for a session holding n_used tokens: dst gets exactly the pages n_used needs (its first pages kept,
  // others released or taken from the pool), every GDN buffer and those pages are copied device to device and dst's
  // device page table written (enqueued; returns without waiting). kResourceExhausted when the pool lacks pages:
  // dst is left as it was. src must hold n_used tokens' pages. src == dst is a no-op.
  Status clone(int src, int dst, int n_used, cudaStream_t stream);

  // Copies the slot into `state` in ref::SessionState's layout: every GDN s/conv and, per attention layer, K and V
  // rows [0, n_used) with kv(l).n_used = n_used. The state's token history is left as it is (the slot has none).
  // `state` must come from SessionState::create with the same hparams (n_ctx may differ but must be >= n_used); the
  // slot must hold n_used tokens' pages. Waits for `stream`.
  Status download(int slot, int n_used, ref::SessionState& state, cudaStream_t stream) const;
  // The inverse: gives the slot exactly the pages the state's tokens need (as clone does for dst; kResourceExhausted
  // leaves the slot as it was), copies the GDN state and the first kv(l).n_used rows of each attention layer's cache
  // into it (all attention layers must agree on n_used, <= n_ctx) and writes its device page table. Waits for
  // `stream`.
  Status upload(const ref::SessionState& state, int slot, cudaStream_t stream);

 private:
  StateSlots() = default;
  void free_device();
  Status check_slot(int slot) const;
  Status check_host_layer(const ref::SessionState& state, uint32_t l) const;
  Status check_layer(uint32_t layer, LayerKind want) const;
  Status check_page(int32_t page) const;
  Status resize_pages(int slot, int64_t n_tokens);
  float* gdn_at(int slot, uint64_t offset) const;
  float* page_at_floats(int32_t page, uint64_t offset_floats) const;

  int n_slots_ = 0;
  int n_ctx_ = 0;
  int n_head_kv_ = 0;
  int head_dim_ = 0;
  int n_attn_ = 0;
  int max_pages_ = 0;
  ref::GdnDims dims_;
  std::vector<LayerKind> kinds_;
  std::vector<int> attn_index_;  // per layer: index among the attention layers, -1 for GDN
  // Per GDN layer, byte offsets inside a slot's region (a = s, b = conv).
  std::vector<uint64_t> off_a_, off_b_;
  uint64_t gdn_s_floats_ = 0, gdn_conv_floats_ = 0;
  uint64_t rows_floats_ = 0;  // one K (or V) block of a page for one layer: page_size · n_kv · hd
  uint64_t slot_bytes_ = 0;
  uint64_t page_bytes_ = 0;
  uint64_t table_bytes_ = 0;
  KvPageAllocator pages_;
  uint8_t* gdn_base_ = nullptr;     // device, n_slots · slot_bytes
  float* pool_ = nullptr;           // device, n_pages · page_bytes
  float** gdn_tables_ = nullptr;    // device, [n_layer][2][n_slots] (null entries for attention layers)
  int32_t* page_tables_ = nullptr;  // device, [n_slots][max_pages]
};

}  // namespace kestrel::gpu
