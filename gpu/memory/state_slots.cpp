// StateSlots (see state_slots.h): per-slot GDN state with per-layer device pointer tables, the shared KV page pool
// with per-slot page tables, host copies in ref::SessionState's layout.
#include "gpu/memory/state_slots.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "gpu/cuda_check.h"

namespace kestrel::gpu {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::string str(uint64_t v) { return std::to_string(v); }

std::string gb(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(b) / 1e9);
  return buf;
}

bool power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

// Pages one slot's page table holds: n_ctx positions in pages of page_size.
uint64_t pages_per_slot(int n_ctx, int page_size) {
  return (static_cast<uint64_t>(n_ctx) + static_cast<uint64_t>(page_size) - 1) / static_cast<uint64_t>(page_size);
}

// The device tables' bytes: a (state, history) pointer pair per layer and slot, then a page table row per slot.
uint64_t pointer_table_bytes(size_t n_layers, int n_slots) {
  return align_up(n_layers * 2 * static_cast<uint64_t>(n_slots) * sizeof(float*));
}
uint64_t table_bytes_of(size_t n_layers, int n_slots, uint64_t max_pages) {
  return pointer_table_bytes(n_layers, n_slots) +
         align_up(static_cast<uint64_t>(n_slots) * max_pages * sizeof(int32_t));
}

// Per GDN layer: S and conv history floats.
uint64_t gdn_s_floats_of(const ref::GdnDims& d) { return static_cast<uint64_t>(d.n_v_heads) * d.d_k * d.d_v; }
uint64_t gdn_conv_floats_of(const ref::GdnDims& d) {
  return static_cast<uint64_t>(d.conv_dim()) * static_cast<uint64_t>(d.conv_kernel - 1);
}

}  // namespace

uint64_t StateSlots::gdn_bytes_per_slot(const ModelHparams& hp) {
  if (hp.n_gdn_layers() == 0) return 0;
  const ref::GdnDims d = ref::GdnDims::from_hparams(hp);
  return hp.n_gdn_layers() *
         (align_up(gdn_s_floats_of(d) * sizeof(float)) + align_up(gdn_conv_floats_of(d) * sizeof(float)));
}

uint64_t StateSlots::kv_bytes_per_page(const ModelHparams& hp, int page_size) {
  if (page_size < 1) return 0;
  return static_cast<uint64_t>(hp.n_attn_layers()) * 2 * static_cast<uint64_t>(page_size) * hp.n_head_kv * hp.head_dim *
         sizeof(float);
}

uint64_t StateSlots::bytes_for(const ModelHparams& hp, int n_ctx, int n_slots, const KvPoolConfig& kv) {
  if (n_slots < 1 || n_ctx < 1 || hp.layer_kinds.size() != hp.n_layer || !power_of_two(kv.page_size)) return 0;
  const bool attn = hp.n_attn_layers() > 0;
  if (attn && kv.n_pages < 1) return 0;
  const uint64_t tables = table_bytes_of(hp.layer_kinds.size(), n_slots, pages_per_slot(n_ctx, kv.page_size));
  const uint64_t kv_total = attn ? kv_bytes_per_page(hp, kv.page_size) * static_cast<uint64_t>(kv.n_pages) : 0;
  return gdn_bytes_per_slot(hp) * static_cast<uint64_t>(n_slots) + kv_total + tables;
}

Expected<StateSlots> StateSlots::create(const ModelHparams& hp, int n_ctx, int n_slots, const KvPoolConfig& kv) {
  if (n_slots < 1) return make_error(ErrorCode::kInvalidArgument, "state slots: need at least one slot");
  if (n_ctx < 1 || (hp.n_ctx_train > 0 && static_cast<uint32_t>(n_ctx) > hp.n_ctx_train)) {
    return make_error(ErrorCode::kOutOfRange, "state slots: context of " + std::to_string(n_ctx) +
                                                  " tokens is outside 1.." + std::to_string(hp.n_ctx_train) +
                                                  " (the model's context_length)");
  }
  if (hp.layer_kinds.size() != hp.n_layer) {
    return make_error(ErrorCode::kInvalidArgument, "state slots: hparams have " +
                                                       std::to_string(hp.layer_kinds.size()) + " layer kinds for " +
                                                       std::to_string(hp.n_layer) + " layers");
  }
  if (!power_of_two(kv.page_size) || kv.page_size > (1 << 20)) {
    return make_error(ErrorCode::kInvalidArgument, "state slots: a KV page of " + std::to_string(kv.page_size) +
                                                       " positions; it must be a power of two up to 2^20");
  }
  StateSlots ss;
  ss.n_slots_ = n_slots;
  ss.n_ctx_ = n_ctx;
  ss.n_head_kv_ = static_cast<int>(hp.n_head_kv);
  ss.head_dim_ = static_cast<int>(hp.head_dim);
  ss.kinds_ = hp.layer_kinds;
  if (hp.n_gdn_layers() > 0) {
    ss.dims_ = ref::GdnDims::from_hparams(hp);
    KESTREL_TRY(ss.dims_.validate());
    ss.gdn_s_floats_ = gdn_s_floats_of(ss.dims_);
    ss.gdn_conv_floats_ = gdn_conv_floats_of(ss.dims_);
  }
  uint64_t off = 0;
  for (LayerKind k : ss.kinds_) {
    if (k == LayerKind::kGatedDeltaNet) {
      ss.attn_index_.push_back(-1);
      ss.off_a_.push_back(off);
      off = align_up(off + ss.gdn_s_floats_ * sizeof(float));
      ss.off_b_.push_back(off);
      off = align_up(off + ss.gdn_conv_floats_ * sizeof(float));
    } else {
      ss.attn_index_.push_back(ss.n_attn_++);
      ss.off_a_.push_back(0);
      ss.off_b_.push_back(0);
    }
  }
  ss.slot_bytes_ = off;
  ss.max_pages_ = static_cast<int>(pages_per_slot(n_ctx, kv.page_size));
  int64_t n_pages = 0;
  if (ss.n_attn_ > 0) {
    if (ss.n_head_kv_ <= 0 || ss.head_dim_ <= 0) {
      return make_error(ErrorCode::kInvalidArgument, "state slots: attention layers need n_head_kv and head_dim > 0");
    }
    if (kv.n_pages < 1 || kv.n_pages > std::numeric_limits<int32_t>::max()) {
      return make_error(ErrorCode::kInvalidArgument, "state slots: the KV page pool needs 1.." +
                                                         std::to_string(std::numeric_limits<int32_t>::max()) +
                                                         " pages, got " + std::to_string(kv.n_pages));
    }
    n_pages = kv.n_pages;
    ss.rows_floats_ = static_cast<uint64_t>(kv.page_size) * static_cast<uint64_t>(ss.n_head_kv_) * ss.head_dim_;
    ss.page_bytes_ = kv_bytes_per_page(hp, kv.page_size);
  }
  const uint64_t gdn_total = ss.gdn_bytes(), kv_total = ss.page_bytes_ * static_cast<uint64_t>(n_pages);
  const size_t n_ptrs = ss.kinds_.size() * 2 * static_cast<size_t>(n_slots);
  const uint64_t page_entries = static_cast<uint64_t>(n_slots) * static_cast<uint64_t>(ss.max_pages_);
  ss.table_bytes_ = table_bytes_of(ss.kinds_.size(), n_slots, static_cast<uint64_t>(ss.max_pages_));
  const auto device_malloc = [&](void** p, uint64_t bytes, const char* what) -> Status {
    const cudaError_t err = cudaMalloc(p, bytes == 0 ? 1 : bytes);
    if (err == cudaSuccess) return ok_status();
    (void)cudaGetLastError();
    if (err != cudaErrorMemoryAllocation) return cuda_error(err, what, __FILE__, __LINE__);
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    return make_error(
        ErrorCode::kResourceExhausted,
        "state slots: " + std::to_string(n_slots) + " slots' GDN state (" + gb(gdn_total) + ") and a KV cache of " +
            str(static_cast<uint64_t>(n_pages)) + " pages of " + std::to_string(kv.page_size) + " tokens (" +
            str(static_cast<uint64_t>(n_pages) * static_cast<uint64_t>(kv.page_size)) + " tokens, " + gb(kv_total) +
            ") need " + gb(gdn_total + kv_total + ss.table_bytes_) + "; allocating the " + what + " (" + str(bytes) +
            " bytes) failed with " + gb(free_b) + " free on the device; lower the KV cache size or the session count");
  };
  void* p = nullptr;
  KESTREL_TRY(device_malloc(&p, gdn_total, "GDN state"));
  ss.gdn_base_ = static_cast<uint8_t*>(p);
  p = nullptr;
  KESTREL_TRY(device_malloc(&p, kv_total, "KV page pool"));
  ss.pool_ = static_cast<float*>(p);
  p = nullptr;
  KESTREL_TRY(device_malloc(&p, ss.table_bytes_, "slot tables"));
  ss.gdn_tables_ = static_cast<float**>(p);
  ss.page_tables_ =
      reinterpret_cast<int32_t*>(static_cast<uint8_t*>(p) + pointer_table_bytes(ss.kinds_.size(), n_slots));
  // The host bookkeeping after the device memory: a pool the device cannot hold is refused before its free list of
  // page ids is built.
  KESTREL_TRY_ASSIGN(ss.pages_, KvPageAllocator::create(n_pages, kv.page_size, ss.page_bytes_, n_slots, ss.max_pages_));

  // GDN pointer tables: [layer][a|b][slot], null for attention layers.
  std::vector<float*> host_tab(n_ptrs, nullptr);
  for (size_t l = 0; l < ss.kinds_.size(); ++l) {
    if (ss.kinds_[l] != LayerKind::kGatedDeltaNet) continue;
    for (int s = 0; s < n_slots; ++s) {
      host_tab[(l * 2 + 0) * static_cast<size_t>(n_slots) + static_cast<size_t>(s)] = ss.gdn_at(s, ss.off_a_[l]);
      host_tab[(l * 2 + 1) * static_cast<size_t>(n_slots) + static_cast<size_t>(s)] = ss.gdn_at(s, ss.off_b_[l]);
    }
  }
  if (n_ptrs > 0) {
    KESTREL_CUDA_TRY(cudaMemcpy(ss.gdn_tables_, host_tab.data(), n_ptrs * sizeof(float*), cudaMemcpyHostToDevice));
  }
  // The page tables start zeroed (no entry is read before the slot has written its page); the pool is not cleared:
  // a position is read only after the session has written it.
  KESTREL_CUDA_TRY(cudaMemset(ss.page_tables_, 0, page_entries * sizeof(int32_t)));
  if (gdn_total > 0) KESTREL_CUDA_TRY(cudaMemset(ss.gdn_base_, 0, gdn_total));
  KESTREL_CUDA_TRY(cudaDeviceSynchronize());
  return ss;
}

StateSlots::StateSlots(StateSlots&& other) noexcept { *this = std::move(other); }

StateSlots& StateSlots::operator=(StateSlots&& other) noexcept {
  if (this != &other) {
    free_device();
    n_slots_ = std::exchange(other.n_slots_, 0);
    n_ctx_ = other.n_ctx_;
    n_head_kv_ = other.n_head_kv_;
    head_dim_ = other.head_dim_;
    n_attn_ = other.n_attn_;
    max_pages_ = other.max_pages_;
    dims_ = other.dims_;
    kinds_ = std::move(other.kinds_);
    attn_index_ = std::move(other.attn_index_);
    off_a_ = std::move(other.off_a_);
    off_b_ = std::move(other.off_b_);
    gdn_s_floats_ = other.gdn_s_floats_;
    gdn_conv_floats_ = other.gdn_conv_floats_;
    rows_floats_ = other.rows_floats_;
    slot_bytes_ = other.slot_bytes_;
    page_bytes_ = other.page_bytes_;
    table_bytes_ = other.table_bytes_;
    pages_ = std::move(other.pages_);
    gdn_base_ = std::exchange(other.gdn_base_, nullptr);
    pool_ = std::exchange(other.pool_, nullptr);
    gdn_tables_ = std::exchange(other.gdn_tables_, nullptr);
    page_tables_ = std::exchange(other.page_tables_, nullptr);
  }
  return *this;
}

StateSlots::~StateSlots() { free_device(); }

void StateSlots::free_device() {
  if (gdn_base_ != nullptr) (void)cudaFree(gdn_base_);
  if (pool_ != nullptr) (void)cudaFree(pool_);
  if (gdn_tables_ != nullptr) (void)cudaFree(gdn_tables_);  // page_tables_ lives in the same allocation
  gdn_base_ = nullptr;
  pool_ = nullptr;
  gdn_tables_ = nullptr;
  page_tables_ = nullptr;
}

float* StateSlots::gdn_at(int slot, uint64_t offset) const {
  return reinterpret_cast<float*>(gdn_base_ + static_cast<uint64_t>(slot) * slot_bytes_ + offset);
}

float* StateSlots::page_at_floats(int32_t page, uint64_t offset_floats) const {
  return pool_ + static_cast<uint64_t>(page) * (page_bytes_ / sizeof(float)) + offset_floats;
}

Status StateSlots::check_slot(int slot) const {
  if (gdn_base_ == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition, "state slots: not allocated (moved from)");
  }
  if (slot < 0 || slot >= n_slots_) {
    return make_error(ErrorCode::kOutOfRange,
                      "state slots: slot " + std::to_string(slot) + " outside 0.." + std::to_string(n_slots_ - 1));
  }
  return ok_status();
}

Status StateSlots::check_layer(uint32_t layer, LayerKind want) const {
  if (layer >= kinds_.size()) {
    return make_error(ErrorCode::kOutOfRange,
                      "state slots: layer " + std::to_string(layer) + " of " + std::to_string(kinds_.size()));
  }
  if (kinds_[layer] != want) {
    return make_error(ErrorCode::kInvalidArgument,
                      "state slots: layer " + std::to_string(layer) + " is " +
                          (kinds_[layer] == LayerKind::kGatedDeltaNet ? "a GDN" : "an attention") + " layer");
  }
  return ok_status();
}

Status StateSlots::check_page(int32_t page) const {
  if (page < 0 || page >= pages_.n_pages()) {
    return make_error(ErrorCode::kOutOfRange, "state slots: page " + std::to_string(page) + " outside 0.." +
                                                  std::to_string(pages_.n_pages() - 1));
  }
  return ok_status();
}

Expected<GdnSlotTable> StateSlots::gdn_table(uint32_t layer) const {
  KESTREL_TRY(check_layer(layer, LayerKind::kGatedDeltaNet));
  const size_t n = static_cast<size_t>(n_slots_);
  return GdnSlotTable{gdn_tables_ + (layer * 2 + 0) * n, gdn_tables_ + (layer * 2 + 1) * n};
}

Expected<KvPageTable> StateSlots::page_table() const {
  if (n_attn_ == 0) return make_error(ErrorCode::kFailedPrecondition, "state slots: the model has no attention layers");
  KvPageTable t;
  t.pages = page_tables_;
  t.page_stride = static_cast<int64_t>(page_bytes_ / sizeof(float));
  t.page_size = pages_.page_size();
  t.max_pages = max_pages_;
  t.n_head_kv = n_head_kv_;
  t.head_dim = head_dim_;
  return t;
}

Expected<KvPageTable> StateSlots::kv_table(uint32_t layer) const {
  KESTREL_TRY(check_layer(layer, LayerKind::kFullAttention));
  KESTREL_TRY_ASSIGN(KvPageTable t, page_table());
  const uint64_t a = static_cast<uint64_t>(attn_index_[layer]);
  t.k = pool_ + (2 * a + 0) * rows_floats_;
  t.v = pool_ + (2 * a + 1) * rows_floats_;
  return t;
}

Expected<float*> StateSlots::gdn_s(int slot, uint32_t layer) const {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_layer(layer, LayerKind::kGatedDeltaNet));
  return gdn_at(slot, off_a_[layer]);
}
Expected<float*> StateSlots::gdn_conv(int slot, uint32_t layer) const {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_layer(layer, LayerKind::kGatedDeltaNet));
  return gdn_at(slot, off_b_[layer]);
}
Expected<float*> StateSlots::kv_k(int32_t page, uint32_t layer) const {
  KESTREL_TRY(check_layer(layer, LayerKind::kFullAttention));
  KESTREL_TRY(check_page(page));
  return page_at_floats(page, (2 * static_cast<uint64_t>(attn_index_[layer]) + 0) * rows_floats_);
}
Expected<float*> StateSlots::kv_v(int32_t page, uint32_t layer) const {
  KESTREL_TRY(check_layer(layer, LayerKind::kFullAttention));
  KESTREL_TRY(check_page(page));
  return page_at_floats(page, (2 * static_cast<uint64_t>(attn_index_[layer]) + 1) * rows_floats_);
}

Expected<int32_t> StateSlots::page_at(int slot, int64_t position) const {
  KESTREL_TRY(check_slot(slot));
  if (n_attn_ == 0) return 0;
  return pages_.page_at(slot, position);
}

Status StateSlots::reserve(int slot, int64_t n_tokens) {
  KESTREL_TRY(check_slot(slot));
  if (n_tokens < 0 || n_tokens > n_ctx_) {
    return make_error(ErrorCode::kOutOfRange, "state slots: " + std::to_string(n_tokens) + " tokens outside 0.." +
                                                  std::to_string(n_ctx_) + " (a slot's largest context)");
  }
  if (n_attn_ == 0) return ok_status();
  return pages_.grow(slot, n_tokens);
}

void StateSlots::release(int slot) { pages_.release(slot); }

Status StateSlots::resize_pages(int slot, int64_t n_tokens) {
  if (n_attn_ == 0) return ok_status();
  return pages_.resize(slot, n_tokens);
}

Status StateSlots::write_page_table(int slot, cudaStream_t stream) {
  KESTREL_TRY(check_slot(slot));
  const std::span<const int32_t> p = pages_.pages(slot);
  if (p.empty()) return ok_status();
  // From pageable memory: the call returns once the entries are staged, so the list may change afterwards.
  KESTREL_CUDA_TRY(cudaMemcpyAsync(page_tables_ + static_cast<size_t>(slot) * static_cast<size_t>(max_pages_), p.data(),
                                   p.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  return ok_status();
}

Status StateSlots::reset(int slot, cudaStream_t stream) {
  KESTREL_TRY(check_slot(slot));
  if (slot_bytes_ > 0) KESTREL_CUDA_TRY(cudaMemsetAsync(gdn_at(slot, 0), 0, slot_bytes_, stream));
  release(slot);
  return ok_status();
}

Status StateSlots::clone(int src, int dst, int n_used, cudaStream_t stream) {
  KESTREL_TRY(check_slot(src));
  KESTREL_TRY(check_slot(dst));
  if (n_used < 0 || n_used > n_ctx_) {
    return make_error(ErrorCode::kOutOfRange, "state slots: clone of " + std::to_string(n_used) +
                                                  " tokens outside 0.." + std::to_string(n_ctx_));
  }
  if (src == dst) return ok_status();
  const int64_t n_pages_used = n_attn_ > 0 ? pages_.pages_for(n_used) : 0;
  if (static_cast<int64_t>(pages_.pages(src).size()) < n_pages_used) {
    return make_error(ErrorCode::kOutOfRange, "state slots: clone of " + std::to_string(n_used) + " tokens from slot " +
                                                  std::to_string(src) + ", which holds " +
                                                  std::to_string(pages_.pages(src).size()) + " pages of " +
                                                  std::to_string(pages_.page_size()) + " tokens");
  }
  KESTREL_TRY(resize_pages(dst, n_used));  // refused: dst is unchanged
  if (slot_bytes_ > 0) {
    KESTREL_CUDA_TRY(cudaMemcpyAsync(gdn_at(dst, 0), gdn_at(src, 0), slot_bytes_, cudaMemcpyDeviceToDevice, stream));
  }
  const std::span<const int32_t> from = pages_.pages(src), to = pages_.pages(dst);
  for (int64_t i = 0; i < n_pages_used; ++i) {
    // Whole pages, every attention layer at once; rows past n_used are never read.
    KESTREL_CUDA_TRY(cudaMemcpyAsync(page_at_floats(to[static_cast<size_t>(i)], 0),
                                     page_at_floats(from[static_cast<size_t>(i)], 0), page_bytes_,
                                     cudaMemcpyDeviceToDevice, stream));
  }
  return write_page_table(dst, stream);
}

// Layer l of a host session state has this model's geometry (a GDN state of the right size, or a KV cache with the
// right heads).
Status StateSlots::check_host_layer(const ref::SessionState& state, uint32_t l) const {
  if (kinds_[l] == LayerKind::kGatedDeltaNet) {
    const ref::GdnState& g = state.gdn(l);
    if (g.s.size() != gdn_s_floats_ || g.conv.size() != gdn_conv_floats_) {
      return make_error(ErrorCode::kInvalidArgument,
                        "state slots: host state layer " + std::to_string(l) + " is not a GDN layer of this model");
    }
    return ok_status();
  }
  const ref::KvCache& c = state.kv(l);
  if (c.n_head_kv != n_head_kv_ || c.head_dim != head_dim_) {
    return make_error(ErrorCode::kInvalidArgument, "state slots: host state layer " + std::to_string(l) +
                                                       " is not an attention layer of this model");
  }
  return ok_status();
}

Status StateSlots::download(int slot, int n_used, ref::SessionState& state, cudaStream_t stream) const {
  KESTREL_TRY(check_slot(slot));
  if (n_used < 0 || n_used > n_ctx_ || n_used > state.n_ctx()) {
    return make_error(ErrorCode::kOutOfRange, "state slots: download of " + std::to_string(n_used) +
                                                  " tokens (slot context " + std::to_string(n_ctx_) +
                                                  ", host state context " + std::to_string(state.n_ctx()) + ")");
  }
  const std::span<const int32_t> pages = pages_.pages(slot);
  const int64_t n_pages_used = n_attn_ > 0 ? pages_.pages_for(n_used) : 0;
  if (static_cast<int64_t>(pages.size()) < n_pages_used) {
    return make_error(ErrorCode::kOutOfRange, "state slots: download of " + std::to_string(n_used) +
                                                  " tokens from slot " + std::to_string(slot) + ", which holds " +
                                                  std::to_string(pages.size()) + " pages of " +
                                                  std::to_string(pages_.page_size()) + " tokens");
  }
  // Check the whole geometry before writing anything into `state`.
  for (uint32_t l = 0; l < n_layer(); ++l) {
    KESTREL_TRY(check_host_layer(state, l));
  }
  const uint64_t row_floats = static_cast<uint64_t>(n_head_kv_) * static_cast<uint64_t>(head_dim_);
  const int64_t ps = pages_.page_size();
  for (uint32_t l = 0; l < n_layer(); ++l) {
    if (kinds_[l] == LayerKind::kGatedDeltaNet) {
      ref::GdnState& g = state.gdn(l);
      KESTREL_CUDA_TRY(cudaMemcpyAsync(g.s.data(), gdn_at(slot, off_a_[l]), g.s.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
      KESTREL_CUDA_TRY(cudaMemcpyAsync(g.conv.data(), gdn_at(slot, off_b_[l]), g.conv.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
      continue;
    }
    ref::KvCache& c = state.kv(l);
    const uint64_t a = static_cast<uint64_t>(attn_index_[l]);
    for (int64_t i = 0; i < n_pages_used; ++i) {
      const int64_t r0 = i * ps, rows = std::min<int64_t>(ps, n_used - r0);
      const uint64_t bytes = static_cast<uint64_t>(rows) * row_floats * sizeof(float);
      const int32_t page = pages[static_cast<size_t>(i)];
      KESTREL_CUDA_TRY(cudaMemcpyAsync(c.k.data() + static_cast<uint64_t>(r0) * row_floats,
                                       page_at_floats(page, (2 * a + 0) * rows_floats_), bytes, cudaMemcpyDeviceToHost,
                                       stream));
      KESTREL_CUDA_TRY(cudaMemcpyAsync(c.v.data() + static_cast<uint64_t>(r0) * row_floats,
                                       page_at_floats(page, (2 * a + 1) * rows_floats_), bytes, cudaMemcpyDeviceToHost,
                                       stream));
    }
    c.n_used = n_used;
  }
  KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
  return ok_status();
}

Status StateSlots::upload(const ref::SessionState& state, int slot, cudaStream_t stream) {
  KESTREL_TRY(check_slot(slot));
  int n_used = -1;
  for (uint32_t l = 0; l < n_layer(); ++l) {
    KESTREL_TRY(check_host_layer(state, l));
    if (kinds_[l] != LayerKind::kGatedDeltaNet) {
      const ref::KvCache& c = state.kv(l);
      if (n_used >= 0 && c.n_used != n_used) {
        return make_error(ErrorCode::kInvalidArgument,
                          "state slots: host attention layers disagree on the token count (" + std::to_string(n_used) +
                              " vs " + std::to_string(c.n_used) + ")");
      }
      n_used = c.n_used;
    }
  }
  n_used = std::max(n_used, 0);
  if (n_used > n_ctx_) {
    return make_error(ErrorCode::kOutOfRange, "state slots: host state holds " + std::to_string(n_used) +
                                                  " tokens, the slots hold at most " + std::to_string(n_ctx_));
  }
  KESTREL_TRY(resize_pages(slot, n_used));  // refused: the slot is unchanged
  const std::span<const int32_t> pages = pages_.pages(slot);
  const uint64_t row_floats = static_cast<uint64_t>(n_head_kv_) * static_cast<uint64_t>(head_dim_);
  const int64_t ps = pages_.page_size();
  for (uint32_t l = 0; l < n_layer(); ++l) {
    if (kinds_[l] == LayerKind::kGatedDeltaNet) {
      const ref::GdnState& g = state.gdn(l);
      KESTREL_CUDA_TRY(cudaMemcpyAsync(gdn_at(slot, off_a_[l]), g.s.data(), g.s.size() * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
      KESTREL_CUDA_TRY(cudaMemcpyAsync(gdn_at(slot, off_b_[l]), g.conv.data(), g.conv.size() * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
      continue;
    }
    const ref::KvCache& c = state.kv(l);
    const uint64_t a = static_cast<uint64_t>(attn_index_[l]);
    for (size_t i = 0; i < pages.size(); ++i) {
      const int64_t r0 = static_cast<int64_t>(i) * ps, rows = std::min<int64_t>(ps, n_used - r0);
      const uint64_t bytes = static_cast<uint64_t>(rows) * row_floats * sizeof(float);
      KESTREL_CUDA_TRY(cudaMemcpyAsync(page_at_floats(pages[i], (2 * a + 0) * rows_floats_),
                                       c.k.data() + static_cast<uint64_t>(r0) * row_floats, bytes,
                                       cudaMemcpyHostToDevice, stream));
      KESTREL_CUDA_TRY(cudaMemcpyAsync(page_at_floats(pages[i], (2 * a + 1) * rows_floats_),
                                       c.v.data() + static_cast<uint64_t>(r0) * row_floats, bytes,
                                       cudaMemcpyHostToDevice, stream));
    }
  }
  KESTREL_TRY(write_page_table(slot, stream));
  KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
  return ok_status();
}

}  // namespace kestrel::gpu
