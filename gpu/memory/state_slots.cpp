// StateSlots (see state_slots.h): one allocation of n_slots slots, per-layer device pointer tables, host copies in
// ref::SessionState's layout.
#include "gpu/memory/state_slots.h"

#include <string>
#include <utility>

#include "gpu/cuda_check.h"

namespace kestrel::gpu {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

uint64_t StateSlots::bytes_for(const ModelHparams& hp, int n_ctx, int n_slots) {
  if (n_slots < 1 || n_ctx < 1 || hp.layer_kinds.size() != hp.n_layer) return 0;
  uint64_t gdn_s = 0, gdn_conv = 0, kv = 0;
  if (hp.n_gdn_layers() > 0) {
    const ref::GdnDims d = ref::GdnDims::from_hparams(hp);
    gdn_s = static_cast<uint64_t>(d.n_v_heads) * d.d_k * d.d_v;
    gdn_conv = static_cast<uint64_t>(d.conv_dim()) * (d.conv_kernel - 1);
  }
  if (hp.n_attn_layers() > 0) kv = static_cast<uint64_t>(n_ctx) * hp.n_head_kv * hp.head_dim;
  // create()'s layout: per layer its two arrays, each 256-aligned.
  uint64_t off = 0;
  for (LayerKind k : hp.layer_kinds) {
    off = align_up(off + (k == LayerKind::kGatedDeltaNet ? gdn_s : kv) * sizeof(float));
    off = align_up(off + (k == LayerKind::kGatedDeltaNet ? gdn_conv : kv) * sizeof(float));
  }
  return off * static_cast<uint64_t>(n_slots);
}

Expected<StateSlots> StateSlots::create(const ModelHparams& hp, int n_ctx, int n_slots) {
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
  StateSlots ss;
  ss.n_slots_ = n_slots;
  ss.n_ctx_ = n_ctx;
  ss.n_head_kv_ = static_cast<int>(hp.n_head_kv);
  ss.head_dim_ = static_cast<int>(hp.head_dim);
  ss.kinds_ = hp.layer_kinds;
  const bool any_gdn = hp.n_gdn_layers() > 0, any_attn = hp.n_attn_layers() > 0;
  if (any_gdn) {
    ss.dims_ = ref::GdnDims::from_hparams(hp);
    KESTREL_TRY(ss.dims_.validate());
    ss.gdn_s_floats_ = static_cast<uint64_t>(ss.dims_.n_v_heads) * ss.dims_.d_k * ss.dims_.d_v;
    ss.gdn_conv_floats_ = static_cast<uint64_t>(ss.dims_.conv_dim()) * (ss.dims_.conv_kernel - 1);
  }
  if (any_attn) {
    if (ss.n_head_kv_ <= 0 || ss.head_dim_ <= 0) {
      return make_error(ErrorCode::kInvalidArgument, "state slots: attention layers need n_head_kv and head_dim > 0");
    }
    ss.kv_floats_ = static_cast<uint64_t>(n_ctx) * static_cast<uint64_t>(ss.n_head_kv_) * ss.head_dim_;
  }
  uint64_t off = 0;
  for (LayerKind k : ss.kinds_) {
    const uint64_t a = k == LayerKind::kGatedDeltaNet ? ss.gdn_s_floats_ : ss.kv_floats_;
    const uint64_t b = k == LayerKind::kGatedDeltaNet ? ss.gdn_conv_floats_ : ss.kv_floats_;
    ss.off_a_.push_back(off);
    off = align_up(off + a * sizeof(float));
    ss.off_b_.push_back(off);
    off = align_up(off + b * sizeof(float));
  }
  ss.slot_bytes_ = off;
  const uint64_t total = ss.slot_bytes_ * static_cast<uint64_t>(n_slots);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, total == 0 ? 1 : total);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation) {
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      return make_error(ErrorCode::kResourceExhausted, "state slots: " + std::to_string(n_slots) + " slots of " +
                                                           std::to_string(ss.slot_bytes_) + " bytes (n_ctx " +
                                                           std::to_string(n_ctx) + ") need " + std::to_string(total) +
                                                           " bytes, the device has " + std::to_string(free_b) +
                                                           " free; lower the context size or the session count");
    }
    return cuda_error(err, "cudaMalloc(state slots)", __FILE__, __LINE__);
  }
  ss.base_ = static_cast<uint8_t*>(p);
  // Pointer tables: [layer][a|b][slot].
  const size_t n_ptrs = ss.kinds_.size() * 2 * static_cast<size_t>(n_slots);
  std::vector<float*> host_tab(n_ptrs);
  for (size_t l = 0; l < ss.kinds_.size(); ++l) {
    for (int s = 0; s < n_slots; ++s) {
      host_tab[(l * 2 + 0) * static_cast<size_t>(n_slots) + static_cast<size_t>(s)] = ss.at(s, ss.off_a_[l]);
      host_tab[(l * 2 + 1) * static_cast<size_t>(n_slots) + static_cast<size_t>(s)] = ss.at(s, ss.off_b_[l]);
    }
  }
  void* t = nullptr;
  KESTREL_CUDA_TRY(cudaMalloc(&t, n_ptrs == 0 ? sizeof(float*) : n_ptrs * sizeof(float*)));
  ss.tables_ = static_cast<float**>(t);
  if (n_ptrs > 0) {
    KESTREL_CUDA_TRY(cudaMemcpy(ss.tables_, host_tab.data(), n_ptrs * sizeof(float*), cudaMemcpyHostToDevice));
  }
  KESTREL_CUDA_TRY(cudaMemset(ss.base_, 0, total));
  KESTREL_CUDA_TRY(cudaDeviceSynchronize());
  return ss;
}

StateSlots::StateSlots(StateSlots&& other) noexcept { *this = std::move(other); }

StateSlots& StateSlots::operator=(StateSlots&& other) noexcept {
  if (this != &other) {
    release();
    n_slots_ = std::exchange(other.n_slots_, 0);
    n_ctx_ = other.n_ctx_;
    n_head_kv_ = other.n_head_kv_;
    head_dim_ = other.head_dim_;
    dims_ = other.dims_;
    kinds_ = std::move(other.kinds_);
    off_a_ = std::move(other.off_a_);
    off_b_ = std::move(other.off_b_);
    gdn_s_floats_ = other.gdn_s_floats_;
    gdn_conv_floats_ = other.gdn_conv_floats_;
    kv_floats_ = other.kv_floats_;
    slot_bytes_ = other.slot_bytes_;
    base_ = std::exchange(other.base_, nullptr);
    tables_ = std::exchange(other.tables_, nullptr);
  }
  return *this;
}

StateSlots::~StateSlots() { release(); }

void StateSlots::release() {
  if (base_ != nullptr) (void)cudaFree(base_);
  if (tables_ != nullptr) (void)cudaFree(tables_);
  base_ = nullptr;
  tables_ = nullptr;
}

float* StateSlots::at(int slot, uint64_t offset) const {
  return reinterpret_cast<float*>(base_ + static_cast<uint64_t>(slot) * slot_bytes_ + offset);
}

Status StateSlots::check_slot(int slot) const {
  if (base_ == nullptr) return make_error(ErrorCode::kFailedPrecondition, "state slots: not allocated (moved from)");
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

Expected<GdnSlotTable> StateSlots::gdn_table(uint32_t layer) const {
  KESTREL_TRY(check_layer(layer, LayerKind::kGatedDeltaNet));
  const size_t n = static_cast<size_t>(n_slots_);
  return GdnSlotTable{tables_ + (layer * 2 + 0) * n, tables_ + (layer * 2 + 1) * n};
}

Expected<KvSlotTable> StateSlots::kv_table(uint32_t layer) const {
  KESTREL_TRY(check_layer(layer, LayerKind::kFullAttention));
  const size_t n = static_cast<size_t>(n_slots_);
  return KvSlotTable{tables_ + (layer * 2 + 0) * n, tables_ + (layer * 2 + 1) * n, n_ctx_, n_head_kv_, head_dim_};
}

Expected<float*> StateSlots::gdn_s(int slot, uint32_t layer) const {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_layer(layer, LayerKind::kGatedDeltaNet));
  return at(slot, off_a_[layer]);
}
Expected<float*> StateSlots::gdn_conv(int slot, uint32_t layer) const {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_layer(layer, LayerKind::kGatedDeltaNet));
  return at(slot, off_b_[layer]);
}
Expected<float*> StateSlots::kv_k(int slot, uint32_t layer) const {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_layer(layer, LayerKind::kFullAttention));
  return at(slot, off_a_[layer]);
}
Expected<float*> StateSlots::kv_v(int slot, uint32_t layer) const {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_layer(layer, LayerKind::kFullAttention));
  return at(slot, off_b_[layer]);
}

Status StateSlots::reset(int slot, cudaStream_t stream) {
  KESTREL_TRY(check_slot(slot));
  KESTREL_CUDA_TRY(cudaMemsetAsync(at(slot, 0), 0, slot_bytes_, stream));
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
  const uint64_t kv_bytes = static_cast<uint64_t>(n_used) * n_head_kv_ * head_dim_ * sizeof(float);
  for (size_t l = 0; l < kinds_.size(); ++l) {
    const bool gdn = kinds_[l] == LayerKind::kGatedDeltaNet;
    const uint64_t a = gdn ? gdn_s_floats_ * sizeof(float) : kv_bytes;
    const uint64_t b = gdn ? gdn_conv_floats_ * sizeof(float) : kv_bytes;
    if (a > 0) {
      KESTREL_CUDA_TRY(cudaMemcpyAsync(at(dst, off_a_[l]), at(src, off_a_[l]), a, cudaMemcpyDeviceToDevice, stream));
    }
    if (b > 0) {
      KESTREL_CUDA_TRY(cudaMemcpyAsync(at(dst, off_b_[l]), at(src, off_b_[l]), b, cudaMemcpyDeviceToDevice, stream));
    }
  }
  return ok_status();
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
  // Check the whole geometry before writing anything into `state`.
  for (uint32_t l = 0; l < n_layer(); ++l) {
    KESTREL_TRY(check_host_layer(state, l));
  }
  const uint64_t kv_bytes = static_cast<uint64_t>(n_used) * n_head_kv_ * head_dim_ * sizeof(float);
  for (uint32_t l = 0; l < n_layer(); ++l) {
    if (kinds_[l] == LayerKind::kGatedDeltaNet) {
      ref::GdnState& g = state.gdn(l);
      KESTREL_CUDA_TRY(
          cudaMemcpyAsync(g.s.data(), at(slot, off_a_[l]), g.s.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
      KESTREL_CUDA_TRY(cudaMemcpyAsync(g.conv.data(), at(slot, off_b_[l]), g.conv.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
    } else {
      ref::KvCache& c = state.kv(l);
      if (kv_bytes > 0) {
        KESTREL_CUDA_TRY(cudaMemcpyAsync(c.k.data(), at(slot, off_a_[l]), kv_bytes, cudaMemcpyDeviceToHost, stream));
        KESTREL_CUDA_TRY(cudaMemcpyAsync(c.v.data(), at(slot, off_b_[l]), kv_bytes, cudaMemcpyDeviceToHost, stream));
      }
      c.n_used = n_used;
    }
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
  if (n_used > n_ctx_) {
    return make_error(ErrorCode::kOutOfRange, "state slots: host state holds " + std::to_string(n_used) +
                                                  " tokens, the slots hold at most " + std::to_string(n_ctx_));
  }
  const uint64_t kv_bytes = static_cast<uint64_t>(n_used < 0 ? 0 : n_used) * n_head_kv_ * head_dim_ * sizeof(float);
  for (uint32_t l = 0; l < n_layer(); ++l) {
    if (kinds_[l] == LayerKind::kGatedDeltaNet) {
      const ref::GdnState& g = state.gdn(l);
      KESTREL_CUDA_TRY(
          cudaMemcpyAsync(at(slot, off_a_[l]), g.s.data(), g.s.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
      KESTREL_CUDA_TRY(cudaMemcpyAsync(at(slot, off_b_[l]), g.conv.data(), g.conv.size() * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
    } else if (kv_bytes > 0) {
      const ref::KvCache& c = state.kv(l);
      KESTREL_CUDA_TRY(cudaMemcpyAsync(at(slot, off_a_[l]), c.k.data(), kv_bytes, cudaMemcpyHostToDevice, stream));
      KESTREL_CUDA_TRY(cudaMemcpyAsync(at(slot, off_b_[l]), c.v.data(), kv_bytes, cudaMemcpyHostToDevice, stream));
    }
  }
  KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
  return ok_status();
}

}  // namespace kestrel::gpu
