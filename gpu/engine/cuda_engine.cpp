// The CUDA engine (cuda_engine.h): slots bookkeeping on the host, state on the device, ticks as decode passes.
// KV pages are reserved on the host before a tick's passes run; each pass publishes the page of every row's position
// to the device page table itself (forward_pass.h).
#include "gpu/engine/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/engine/placement_planner.h"
#include "core/reference/session_state.h"
#include "gpu/cuda_check.h"
#include "gpu/engine/device_model.h"
#include "gpu/engine/expert_upload.h"
#include "gpu/engine/forward_pass.h"
#include "gpu/memory/state_slots.h"

namespace kestrel::gpu {
namespace {

struct SlotInfo {
  bool used = false;
  int32_t n_ctx = 0;
  int64_t n_past = 0;  // tokens consumed
};

std::string device_label(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "cuda:" + std::to_string(device);
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.0f GiB", static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return "cuda:" + std::to_string(device) + " (" + std::string(prop.name) + ", " + gib + ")";
}

// KV pages one slot holding o.n_ctx tokens takes.
int64_t kv_pages_per_slot(const CudaEngineOptions& o) {
  return (int64_t{o.n_ctx} + o.kv_page_tokens - 1) / std::max(o.kv_page_tokens, 1);
}

class CudaEngineImpl final : public CudaEngine {
 public:
  CudaEngineImpl(const Model& model, int device) : model_(model), device_(device) {}
  ~CudaEngineImpl() override {
    cudaSetDevice(device_);
    pass_.reset();
    slots_.reset();
    dm_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status init(const CudaEngineOptions& o) {
    KESTREL_CUDA_TRY(cudaSetDevice(device_));
    KESTREL_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const ModelHparams& hp = model_.hparams();
    if (o.max_slots < 1) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the CUDA engine needs at least one slot (got " + std::to_string(o.max_slots) + ")");
    }
    if (o.n_ctx < 1 || (hp.n_ctx_train > 0 && static_cast<uint32_t>(o.n_ctx) > hp.n_ctx_train)) {
      return make_error(ErrorCode::kOutOfRange, "the CUDA engine's slot context " + std::to_string(o.n_ctx) +
                                                    " is outside 1.." + std::to_string(hp.n_ctx_train));
    }
    if (o.kv_page_tokens < 1 || o.kv_page_tokens > 65536 || (o.kv_page_tokens & (o.kv_page_tokens - 1)) != 0) {
      return make_error(ErrorCode::kInvalidArgument, "the CUDA engine's KV page of " +
                                                         std::to_string(o.kv_page_tokens) +
                                                         " tokens: a power of two from 1 to 65536 is needed");
    }
    n_ctx_ = o.n_ctx;
    KESTREL_TRY_ASSIGN(const int64_t n_pages, pool_pages(o));
    // The state slots first (their error names the bytes they need and the device's free bytes), then the weights,
    // which must leave room for the pass's scratch.
    KESTREL_TRY_ASSIGN(StateSlots s, StateSlots::create(hp, o.n_ctx, o.max_slots, {o.kv_page_tokens, n_pages}));
    slots_.emplace(std::move(s));
    const std::vector<std::vector<uint8_t>> no_plan;
    const std::vector<std::vector<uint8_t>>& on_gpu = o.placement ? o.placement->expert_on_gpu : no_plan;
    pinned_ = o.pinned_experts;
    KESTREL_TRY_ASSIGN(dm_, DeviceModel::create(model_, ForwardPass::scratch_bytes(hp, o.n_ctx), state_bytes(),
                                                o.progress, stream_, on_gpu, pinned_.get()));
    backend_ = o.expert_backend;
    KESTREL_TRY_ASSIGN(pass_, ForwardPass::create(*dm_, *slots_, o.tuning, stream_, backend_.get()));
    slot_info_.resize(static_cast<size_t>(o.max_slots));
    const std::string gpu = "cuda:" + std::to_string(device_);
    if (o.placement) {
      placement_ = summarize_placement(planner_model(model_.catalog()), *o.placement, gpu);
      placement_.device = device_label(device_) + (dm_->n_hybrid_layers() > 0 ? " + cpu experts" : "");
    } else {
      placement_ = placement_all_on(model_.catalog(), gpu);
      placement_.device = device_label(device_);
    }
    scratch_bytes_ = ForwardPass::scratch_bytes(hp, o.n_ctx);
    return ok_status();
  }

  // Engine
  std::string name() const override { return "cuda"; }
  const ModelHparams& hparams() const override { return model_.hparams(); }
  const PlacementPlan& placement() const override { return placement_; }
  EngineCapabilities capabilities() const override {
    EngineCapabilities c;
    c.max_items_per_pass = kPassMaxTokens;
    // With runs, a prompt alone runs as prompt passes of up to kPromptPassMaxTokens tokens (max_tokens_per_item);
    // beside decoding sessions its chunk fills what their tokens leave of one pass (max_tokens_per_tick), so a prompt
    // costs them a fuller pass, not another one. Without runs a prompt runs a token per pass: 16 a tick bound the
    // others' wait to 16 passes.
    c.max_tokens_per_item = pass_->supports_runs() ? kPromptPassMaxTokens : 16;
    c.max_tokens_per_tick = pass_->supports_runs() ? kPassMaxTokens : 0;
    // A pass of R rows costs about a fixed 2.2 ms plus 0.3 ms a row on the 35B-A3B shape (H100): 8 prompt rows beside
    // one decoding session keep its tick within 2x, and beside D sessions, D prompt rows do.
    c.prompt_tokens_beside_decode = pass_->supports_runs() ? 8 : 0;
    c.max_slot_ctx = n_ctx_;
    return c;
  }
  int32_t max_slots() const override { return static_cast<int32_t>(slot_info_.size()); }
  // The pool's size never changes after init; the pages held come from the last publication (PoolPublisher).
  EngineCachePool cache_pool() const override {
    if (!slots_->has_kv()) return {};
    EngineCachePool p;
    p.tokens_total = slots_->n_pages() * slots_->page_size();
    p.tokens_held = held_pages_.load(std::memory_order_relaxed) * slots_->page_size();
    p.bytes = slots_->kv_bytes();
    return p;
  }

  Expected<SlotId> slot_alloc(int32_t n_ctx) override {
    const PoolPublisher publish(*this);
    if (n_ctx < 1 || n_ctx > n_ctx_) {
      return make_error(ErrorCode::kOutOfRange, "n_ctx " + std::to_string(n_ctx) + " is outside 1.." +
                                                    std::to_string(n_ctx_) + " (the CUDA engine's slot context)");
    }
    for (size_t i = 0; i < slot_info_.size(); ++i) {
      if (slot_info_[i].used) continue;
      KESTREL_CUDA_TRY(cudaSetDevice(device_));
      KESTREL_TRY(slots_->reset(static_cast<int>(i), stream_));
      KESTREL_CUDA_TRY(cudaStreamSynchronize(stream_));
      slot_info_[i] = SlotInfo{true, n_ctx, 0};
      return static_cast<SlotId>(i);
    }
    return make_error(ErrorCode::kResourceExhausted,
                      "all " + std::to_string(slot_info_.size()) + " CUDA engine slots are in use");
  }

  void slot_free(SlotId slot) override {
    const PoolPublisher publish(*this);
    if (!valid(slot)) return;
    slots_->release(slot);  // host bookkeeping: the pages go back to the pool
    slot_info_[static_cast<size_t>(slot)] = SlotInfo{};
  }

  void slot_reset(SlotId slot) override {
    const PoolPublisher publish(*this);
    if (!valid(slot)) return;
    cudaSetDevice(device_);
    if (slots_->reset(slot, stream_) && cudaStreamSynchronize(stream_) == cudaSuccess) {
      slot_info_[static_cast<size_t>(slot)].n_past = 0;
    }
  }

  Status slot_clone(SlotId src, SlotId dst) override {
    const PoolPublisher publish(*this);
    if (!valid(src) || !valid(dst)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "slot_clone: slot " + std::to_string(valid(src) ? dst : src) + " is not allocated");
    }
    if (src == dst) return ok_status();
    const SlotInfo& s = slot_info_[static_cast<size_t>(src)];
    SlotInfo& d = slot_info_[static_cast<size_t>(dst)];
    const int n_used = static_cast<int>(s.n_past);
    if (n_used > d.n_ctx) {
      return make_error(ErrorCode::kOutOfRange, "slot_clone: source holds " + std::to_string(n_used) +
                                                    " tokens, the destination only " + std::to_string(d.n_ctx));
    }
    KESTREL_CUDA_TRY(cudaSetDevice(device_));
    KESTREL_TRY(slots_->clone(src, dst, n_used, stream_));  // kResourceExhausted without the pages: dst unchanged
    KESTREL_CUDA_TRY(cudaStreamSynchronize(stream_));
    d.n_past = s.n_past;
    return ok_status();
  }

  Expected<std::vector<uint8_t>> slot_snapshot(SlotId slot) const override {
    if (!valid(slot)) return not_allocated(slot);
    const SlotInfo& info = slot_info_[static_cast<size_t>(slot)];
    KESTREL_CUDA_TRY(cudaSetDevice(device_));
    KESTREL_TRY_ASSIGN(ref::SessionState state, ref::SessionState::create(model_.hparams(), info.n_ctx));
    KESTREL_TRY(slots_->download(slot, static_cast<int>(info.n_past), state, stream_));
    state.advance(info.n_past);
    return state.snapshot();
  }

  Status slot_restore(SlotId slot, std::span<const uint8_t> bytes) override {
    const PoolPublisher publish(*this);
    if (!valid(slot)) return not_allocated(slot);
    SlotInfo& info = slot_info_[static_cast<size_t>(slot)];
    KESTREL_TRY_ASSIGN(ref::SessionState state, ref::SessionState::create(model_.hparams(), info.n_ctx));
    KESTREL_TRY(state.restore(bytes));  // checks the geometry (n_ctx included) before anything changes
    KESTREL_CUDA_TRY(cudaSetDevice(device_));
    KESTREL_TRY(slots_->upload(state, slot, stream_));  // kResourceExhausted without the pages: the slot unchanged
    info.n_past = state.n_past();
    return ok_status();
  }

  int64_t slot_n_past(SlotId slot) const override {
    return valid(slot) ? slot_info_[static_cast<size_t>(slot)].n_past : 0;
  }
  int32_t slot_n_ctx(SlotId slot) const override {
    return valid(slot) ? slot_info_[static_cast<size_t>(slot)].n_ctx : 0;
  }

  Status check(const EngineStepItem& item) const override {
    if (!valid(item.slot)) return not_allocated(item.slot);
    if (item.tokens.empty())
      return make_error(ErrorCode::kInvalidArgument, "empty batch: at least one token is needed");
    const uint32_t n_vocab = model_.hparams().n_vocab;
    for (size_t i = 0; i < item.tokens.size(); ++i) {
      if (item.tokens[i] < 0 || static_cast<uint32_t>(item.tokens[i]) >= n_vocab) {
        return make_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(item.tokens[i]) + " at index " +
                                                           std::to_string(i) + " is outside the vocabulary [0, " +
                                                           std::to_string(n_vocab) + ")");
      }
    }
    const SlotInfo& s = slot_info_[static_cast<size_t>(item.slot)];
    if (static_cast<size_t>(s.n_past) + item.tokens.size() > static_cast<size_t>(s.n_ctx)) {
      return make_error(ErrorCode::kOutOfRange, "context limit: " + std::to_string(s.n_past) + " tokens + " +
                                                    std::to_string(item.tokens.size()) + " new exceed the session's " +
                                                    std::to_string(s.n_ctx));
    }
    return ok_status();
  }

  void step(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out) override {
    run_tick(items, out, nullptr);
  }

  // CudaEngine
  void step_with_hidden(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out,
                        std::vector<float>* hidden) override {
    run_tick(items, out, hidden);
  }
  uint64_t weight_bytes() const override { return dm_->device_bytes(); }
  uint64_t weight_bytes_unpadded() const override { return dm_->device_bytes() - dm_->pool().padding_bytes(); }
  uint64_t routed_expert_bytes() const override { return dm_->routed_expert_bytes(); }
  int hybrid_layers() const override { return dm_->n_hybrid_layers(); }
  int host_expert_layers() const override { return dm_->n_host_expert_layers(); }
  uint64_t state_bytes() const override { return slots_->device_bytes(); }
  uint64_t scratch_bytes() const override { return scratch_bytes_; }
  CudaKvCacheInfo kv_cache() const override {
    return CudaKvCacheInfo{slots_->page_size(), slots_->bytes_per_page(), slots_->n_pages(), slots_->free_pages()};
  }
  Status set_profiling(bool on) override { return pass_->set_profiling(on); }
  int kernels_per_pass(int rows) const override { return pass_->kernels_per_pass(rows); }
  std::vector<std::pair<std::string, double>> profile(int* passes) const override {
    const PassProfile& p = pass_->profile();
    if (passes != nullptr) *passes = p.passes;
    std::vector<std::pair<std::string, double>> out;
    for (int i = 0; i < static_cast<int>(PassSection::kCount); ++i) {
      out.emplace_back(pass_section_name(static_cast<PassSection>(i)), p.ms[i]);
    }
    return out;
  }
  HostExpertProfile host_expert_profile() const override {
    const PassProfile& p = pass_->profile();
    return HostExpertProfile{p.host_batches, p.host_ms, p.host_wait_ms};
  }
  void clear_profile() override { pass_->clear_profile(); }
  std::string layout_summary() const override {
    return std::to_string(dm_->n_tiled_matrices()) + " projection matrices tiled for GEMV v4, " +
           std::to_string(dm_->n_raw_matrices()) + " raw; " + std::to_string(dm_->n_stacked_layers()) +
           " layers with stacked input projections; " + std::to_string(dm_->n_moe_tiled_layers()) +
           " MoE layers on moe_imma" +
           (dm_->n_hybrid_layers() > 0
                ? "; " + std::to_string(dm_->n_hybrid_layers()) + " MoE layers with routed experts on the host (" +
                      std::to_string(dm_->n_host_expert_layers()) +
                      " with none on the GPU); their experts' upload "
                      "for prompt passes: " +
                      pass_->expert_upload_summary() + "; side read: " + pass_->side_read_summary()
                : std::string());
  }

 private:
  // Publishes the KV pool's use for cache_pool() when the slot call or step that holds it returns (the allocator
  // itself is touched only by those calls, which never overlap).
  struct PoolPublisher {
    CudaEngineImpl& e;
    ~PoolPublisher() {
      if (!e.slots_) return;
      e.held_pages_.store(e.slots_->n_pages() - e.slots_->free_pages(), std::memory_order_relaxed);
    }
  };

  bool valid(SlotId slot) const {
    return slot >= 0 && static_cast<size_t>(slot) < slot_info_.size() && slot_info_[static_cast<size_t>(slot)].used;
  }
  static Error not_allocated(SlotId slot) {
    return make_error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) + " is not allocated");
  }

  // The KV page pool's size in pages (0 for a model without attention layers): o.kv_cache_bytes in whole pages, or
  // the automatic size (cuda_engine.h). The device's free memory is read after the context exists, before anything
  // of this engine is allocated; the weights are estimated from the catalogue (their bytes plus 256 bytes of
  // alignment a tensor), the same sum DeviceModel allocates.
  Expected<int64_t> pool_pages(const CudaEngineOptions& o) const {
    constexpr int64_t kMaxPages = std::numeric_limits<int32_t>::max();  // page ids are int32
    const ModelHparams& hp = model_.hparams();
    const uint64_t page_bytes = StateSlots::kv_bytes_per_page(hp, o.kv_page_tokens);
    if (page_bytes == 0) return int64_t{0};
    if (o.kv_cache_bytes > 0) {
      const uint64_t n = o.kv_cache_bytes / page_bytes;
      if (n < 1) {
        return make_error(ErrorCode::kInvalidArgument,
                          "a KV cache of " + std::to_string(o.kv_cache_bytes) + " bytes holds no page of " +
                              std::to_string(o.kv_page_tokens) + " tokens (" + std::to_string(page_bytes) +
                              " bytes at this model's shape)");
      }
      if (n > static_cast<uint64_t>(kMaxPages)) {
        return make_error(ErrorCode::kOutOfRange, "a KV cache of " + std::to_string(o.kv_cache_bytes) +
                                                      " bytes is more than 2^31 pages; use larger pages");
      }
      return static_cast<int64_t>(n);
    }
    const int64_t per_slot = kv_pages_per_slot(o);
    const int64_t full = per_slot * o.max_slots;
    size_t free_b = 0, total_b = 0;
    KESTREL_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    const uint64_t weights = (o.placement ? o.placement->gpu_bytes : model_.catalog().total_bytes()) +
                             256 * uint64_t{model_.catalog().entries().size()};
    const uint64_t others = weights + ForwardPass::scratch_bytes(hp, o.n_ctx) +
                            StateSlots::gdn_bytes_per_slot(hp) * static_cast<uint64_t>(o.max_slots) +
                            (uint64_t{1} << 30);
    const uint64_t budget = free_b > others ? (free_b - others) / 10 * 9 : 0;
    const int64_t fit = static_cast<int64_t>(std::min<uint64_t>(budget / page_bytes, kMaxPages));
    return std::clamp(fit, per_slot, std::min<int64_t>(full, kMaxPages));
  }

  // Runs the valid items in groups of kPassMaxTokens items, passes of up to kPassMaxTokens rows each until every
  // item's tokens have run: a row per item with tokens left, the rest of the pass to the items with more (runs).
  void run_tick(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out, std::vector<float>* hidden) {
    const PoolPublisher publish(*this);
    const ModelHparams& hp = model_.hparams();
    const size_t layer_floats = size_t{hp.n_layer} * hp.n_embd;
    if (hidden != nullptr) hidden->assign(items.size() * layer_floats, 0.0f);
    std::vector<size_t> ok;
    for (size_t i = 0; i < items.size() && i < out.size(); ++i) {
      out[i].status = check(items[i]);
      if (out[i].status && !items[i].argmax_only && out[i].logits.size() != hp.n_vocab) {
        out[i].status = make_error(ErrorCode::kInternal, "step: the caller's logits buffer holds " +
                                                             std::to_string(out[i].logits.size()) +
                                                             " floats, not n_vocab = " + std::to_string(hp.n_vocab));
      }
      if (out[i].status) {
        for (size_t j : ok) {
          if (items[j].slot == items[i].slot) {
            out[i].status = make_error(ErrorCode::kInvalidArgument,
                                       "slot " + std::to_string(items[i].slot) + " appears twice in one tick");
            break;
          }
        }
      }
      if (out[i].status) ok.push_back(i);
    }
    // The KV pages of every token of the tick, taken before anything runs: an item the pool cannot serve fails here
    // with its slot untouched, and the items before and after it proceed.
    size_t n_ok = 0;
    for (size_t i : ok) {
      const SlotInfo& s = slot_info_[static_cast<size_t>(items[i].slot)];
      out[i].status = slots_->reserve(items[i].slot, s.n_past + static_cast<int64_t>(items[i].tokens.size()));
      if (out[i].status) ok[n_ok++] = i;
    }
    ok.resize(n_ok);
    if (Status st = cuda_status(cudaSetDevice(device_), "cudaSetDevice", __FILE__, __LINE__); !st) {
      for (size_t i : ok) out[i].status = st;
      return;
    }
    const bool runs = pass_->supports_runs();
    // Items with more tokens than a pass's rows (prompts) run as prompt passes of their own, each layer's weights
    // read once for up to kPromptPassMaxTokens of their tokens; the others share passes below.
    if (runs) {
      size_t kept = 0;
      for (size_t i : ok) {
        if (items[i].tokens.size() <= static_cast<size_t>(kPassMaxTokens)) {
          ok[kept++] = i;
          continue;
        }
        run_prompt_item(items[i], out[i], hidden != nullptr ? hidden->data() + i * layer_floats : nullptr);
      }
      ok.resize(kept);
    }
    std::vector<PassRow> rows;
    std::vector<size_t> row_item;
    std::vector<float> pass_hidden;
    for (size_t g0 = 0; g0 < ok.size(); g0 += kPassMaxTokens) {
      const size_t g1 = std::min(ok.size(), g0 + kPassMaxTokens);
      // Tokens of each item already passed, and those the next pass takes.
      std::vector<size_t> done(g1 - g0, 0), take(g1 - g0, 0);
      Status st = ok_status();
      while (st) {
        // Every item with tokens left gets one row, then (with runs) the rows left over go to the items with more,
        // in item order: a decode token never waits behind a prompt for more than the pass they share.
        size_t room = kPassMaxTokens;
        bool any = false;
        for (size_t g = g0; g < g1; ++g) {
          const size_t left = items[ok[g]].tokens.size() - done[g - g0];
          take[g - g0] = left > 0 ? 1 : 0;
          room -= take[g - g0];
          any = any || left > 0;
        }
        if (!any) break;
        for (size_t g = g0; g < g1 && runs && room > 0; ++g) {
          const size_t extra = std::min(items[ok[g]].tokens.size() - done[g - g0] - take[g - g0], room);
          take[g - g0] += extra;
          room -= extra;
        }
        // Rows that want logits (an item's last token) first: lm_head runs only for the leading rows.
        rows.clear();
        row_item.clear();
        for (int want = 1; want >= 0; --want) {
          for (size_t g = g0; g < g1; ++g) {
            const size_t i = ok[g];
            const EngineStepItem& it = items[i];
            const SlotInfo& s = slot_info_[static_cast<size_t>(it.slot)];
            for (size_t t = done[g - g0]; t < done[g - g0] + take[g - g0]; ++t) {
              if ((t + 1 == it.tokens.size()) != (want == 1)) continue;
              PassRow r;
              r.slot = it.slot;
              r.token = it.tokens[t];
              r.position = static_cast<int32_t>(s.n_past + static_cast<int64_t>(t));
              r.logits = want == 1 && !it.argmax_only ? out[i].logits.data() : nullptr;
              r.argmax = want == 1 ? &out[i].argmax : nullptr;
              rows.push_back(r);
              row_item.push_back(i);
            }
          }
        }
        for (size_t g = g0; g < g1; ++g) done[g - g0] += take[g - g0];
        const bool capture = hidden != nullptr;
        if (capture) pass_hidden.assign(rows.size() * layer_floats, 0.0f);
        st = pass_->run(rows, capture ? pass_hidden.data() : nullptr);
        if (st && capture) {
          // pass_hidden is [n_layer][rows][H]; an item's last token's rows go to its [n_layer][H].
          for (size_t r = 0; r < rows.size(); ++r) {
            if (rows[r].argmax == nullptr) continue;
            for (uint32_t l = 0; l < hp.n_layer; ++l) {
              std::copy_n(pass_hidden.data() + (size_t{l} * rows.size() + r) * hp.n_embd, hp.n_embd,
                          hidden->data() + row_item[r] * layer_floats + size_t{l} * hp.n_embd);
            }
          }
        }
      }
      for (size_t g = g0; g < g1; ++g) {
        const size_t i = ok[g];
        if (!st) {
          out[i].status = make_error(st.error().code,
                                     "the CUDA engine's pass failed; this session's state on the "
                                     "device is no longer consistent, reset it: " +
                                         st.error().message);
          continue;
        }
        slot_info_[static_cast<size_t>(items[i].slot)].n_past += static_cast<int64_t>(items[i].tokens.size());
      }
    }
  }

  // An item's tokens as prompt passes of up to kPromptPassMaxTokens tokens; the last pass gives the logits (or the
  // argmax) and, when hidden is not null, the last token's residual stream after every layer (f32 [n_layer, H]).
  void run_prompt_item(const EngineStepItem& it, EngineStepOutput& out, float* hidden) {
    SlotInfo& s = slot_info_[static_cast<size_t>(it.slot)];
    Status st = ok_status();
    for (size_t t0 = 0; t0 < it.tokens.size() && st; t0 += kPromptPassMaxTokens) {
      const size_t n = std::min(it.tokens.size() - t0, static_cast<size_t>(kPromptPassMaxTokens));
      const bool last = t0 + n == it.tokens.size();
      st = pass_->run_prompt(it.slot, it.tokens.subspan(t0, n), static_cast<int32_t>(s.n_past + int64_t(t0)),
                             last && !it.argmax_only ? out.logits.data() : nullptr, last ? &out.argmax : nullptr,
                             last ? hidden : nullptr);
    }
    if (!st) {
      out.status = make_error(st.error().code,
                              "the CUDA engine's pass failed; this session's state on the device is no longer "
                              "consistent, reset it: " +
                                  st.error().message);
      return;
    }
    s.n_past += static_cast<int64_t>(it.tokens.size());
  }

  const Model& model_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  int32_t n_ctx_ = 0;
  std::shared_ptr<const PinnedExperts> pinned_;  // outlives dm_ and backend_, whose host views point into it
  std::unique_ptr<DeviceModel> dm_;
  std::optional<StateSlots> slots_;
  std::unique_ptr<ForwardPass> pass_;
  std::shared_ptr<ExpertBackend> backend_;  // outlives pass_ and the stream (released after the destructor's body)
  std::vector<SlotInfo> slot_info_;
  std::atomic<int64_t> held_pages_{0};  // KV pages the slots hold, for cache_pool() (PoolPublisher)
  PlacementPlan placement_;
  uint64_t scratch_bytes_ = 0;
};

}  // namespace

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  if (n == 0) return "no CUDA device";
  return "";
}

Expected<CudaMemory> cuda_memory(int device) {
  if (std::string why = cuda_unavailable_reason(); !why.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "no CUDA device memory to measure: " + why);
  }
  KESTREL_CUDA_TRY(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  KESTREL_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  return CudaMemory{free_b, total_b};
}

Expected<uint64_t> cuda_auto_weight_budget(const Model& model, const PlannerModel& planner,
                                           const CudaEngineOptions& options) {
  KESTREL_TRY_ASSIGN(const CudaMemory mem, cuda_memory(options.device));
  const ModelHparams& hp = model.hparams();
  // The KV term is every slot at n_ctx, the most the automatic pool takes (cuda_engine.h).
  const int64_t kv_pages =
      options.kv_cache_bytes > 0
          ? static_cast<int64_t>(options.kv_cache_bytes /
                                 std::max<uint64_t>(StateSlots::kv_bytes_per_page(hp, options.kv_page_tokens), 1))
          : kv_pages_per_slot(options) * options.max_slots;
  const uint64_t state = StateSlots::bytes_for(hp, options.n_ctx, options.max_slots,
                                               KvPoolConfig{options.kv_page_tokens, std::max<int64_t>(kv_pages, 1)});
  const uint64_t scratch = ForwardPass::scratch_bytes(hp, options.n_ctx);
  uint64_t reserved = state + scratch + kCudaHeadroomBytes;
  // When the weights will not all fit, some experts stay on the host, and long prompt passes stage them on the GPU.
  if (options.tuning.expert_upload_min_tokens != 0 && reserved < mem.free) {
    uint64_t weights = 0;
    for (const PlannerTensor& t : planner.tensors) weights += t.bytes;
    if (weights > mem.free - reserved) reserved += ExpertUpload::device_bytes_for(planner);
  }
  if (reserved >= mem.free) {
    return make_error(ErrorCode::kResourceExhausted,
                      "no GPU memory is left for weights: the device has " + std::to_string(mem.free) +
                          " bytes free, and the sessions' state (" + std::to_string(state) + " bytes for " +
                          std::to_string(options.max_slots) + " slots of " + std::to_string(options.n_ctx) +
                          " tokens), the pass scratch (" + std::to_string(scratch) + "), the headroom (" +
                          std::to_string(kCudaHeadroomBytes) + ") and any expert staging take " +
                          std::to_string(reserved));
  }
  return mem.free - reserved;
}

Expected<std::unique_ptr<CudaEngine>> make_cuda_engine(const Model& model, const CudaEngineOptions& options) {
  if (std::string why = cuda_unavailable_reason(); !why.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "the CUDA engine cannot start: " + why);
  }
  auto e = std::make_unique<CudaEngineImpl>(model, options.device);
  KESTREL_TRY(e->init(options));
  return std::unique_ptr<CudaEngine>(std::move(e));
}

}  // namespace kestrel::gpu
