// The CPU Engine (cpu_engine.h): slots of ref::SessionState, passes of stacked token rows through the blocks.
#include "cpu/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/quant/quant.h"
#include "core/reference/forward.h"
#include "core/reference/model_weights.h"
#include "core/reference/norm.h"
#include "core/sampler/logit_scan.h"
#include "cpu/attention_block.h"
#include "cpu/ffn_block.h"
#include "cpu/gdn_block.h"
#include "cpu/isa.h"
#include "cpu/matmul.h"
#include "cpu/populate.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {
namespace {

// Tokens of one item per pass (prompts longer than this take several): a multiple of the delta rule's 64-token
// chunk, so passes keep whole aligned chunks intact (gdn_block.h).
constexpr int kPassTokensPerItem = 128;

size_t sz(int64_t v) { return static_cast<size_t>(v); }

Status check_kernel(const ref::QuantMatrix& w, const std::string& what) {
  if (w.data == nullptr) return ok_status();  // an unused role (the ref checks say which roles are required)
  if (!gemv_supports(w.type)) {
    return make_error(ErrorCode::kUnsupported,
                      "cpu engine: no CPU kernel for " + what + " of type " + std::string(ggml_type_name(w.type)));
  }
  return ok_status();
}

// A SwiGLU pair runs gate and up in one task (matmul.h), so they must share a type.
Status check_pair(GgmlType gate, GgmlType up, const std::string& what) {
  if (gate == up) return ok_status();
  return make_error(ErrorCode::kUnsupported, "cpu engine: " + what + " gate (" + std::string(ggml_type_name(gate)) +
                                                 ") and up (" + std::string(ggml_type_name(up)) +
                                                 ") of different types");
}

Status check_kernels(const ref::RefModelWeights& w) {
  KESTREL_TRY(check_kernel(w.output, "output"));
  if (!quant_can_dequantize(w.token_embd.type)) {
    return make_error(ErrorCode::kUnsupported,
                      "cpu engine: cannot read token_embd of type " + std::string(ggml_type_name(w.token_embd.type)));
  }
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const ref::RefLayerWeights& lw = w.layers[l];
    const std::string at = "layer " + std::to_string(l) + " ";
    if (lw.kind == LayerKind::kGatedDeltaNet) {
      for (const ref::QuantMatrix* m :
           {&lw.gdn.qkv, &lw.gdn.gate, &lw.gdn.beta, &lw.gdn.alpha, &lw.gdn.ba, &lw.gdn.ssm_in, &lw.gdn.ssm_out}) {
        KESTREL_TRY(check_kernel(*m, at + "gdn projection"));
      }
    } else {
      for (const ref::QuantMatrix* m : {&lw.attn.q, &lw.attn.k, &lw.attn.v, &lw.attn.o}) {
        KESTREL_TRY(check_kernel(*m, at + "attention projection"));
      }
    }
    if (lw.is_moe) {
      const ref::MoeWeights& m = lw.moe;
      if (m.n_expert_used > kMaxExpertChoices) {  // ExpertBlock sorts a row's choices on the stack
        return make_error(ErrorCode::kUnsupported, "cpu engine: " + std::to_string(m.n_expert_used) +
                                                       " experts per token (at most " +
                                                       std::to_string(kMaxExpertChoices) + ")");
      }
      for (const ref::QuantMatrix* q : {&m.router, &m.shared_gate_inp, &m.gate_shexp, &m.up_shexp, &m.down_shexp}) {
        KESTREL_TRY(check_kernel(*q, at + "moe"));
      }
      for (const ref::QuantExperts* e : {&m.gate_exps, &m.up_exps, &m.down_exps}) {
        KESTREL_TRY(check_kernel(ref::QuantMatrix{e->type, e->data, e->n_in, e->n_out}, at + "experts"));
      }
      KESTREL_TRY(check_pair(m.gate_exps.type, m.up_exps.type, at + "experts'"));
      if (m.has_shared_expert()) KESTREL_TRY(check_pair(m.gate_shexp.type, m.up_shexp.type, at + "shared expert's"));
    } else {
      for (const ref::QuantMatrix* q : {&lw.dense.gate, &lw.dense.up, &lw.dense.down}) {
        KESTREL_TRY(check_kernel(*q, at + "ffn"));
      }
      KESTREL_TRY(check_pair(lw.dense.gate.type, lw.dense.up.type, at + "ffn's"));
    }
  }
  return ok_status();
}

class CpuEngineImpl final : public CpuEngine {
 public:
  CpuEngineImpl(const Model& model, ref::RefModelWeights weights, const CpuEngineOptions& o,
                std::unique_ptr<WorkerPool> pool, Isa isa, double huge_page_share)
      : model_(model),
        weights_(std::move(weights)),
        slots_(sz(o.max_slots)),
        pool_(std::move(pool)),
        mm_(*pool_, isa, o.activations == CpuActivations::kInt8 ? GemvInput::kQ8 : GemvInput::kF32),
        max_ctx_(o.max_ctx > 0 ? o.max_ctx : static_cast<int32_t>(model.hparams().n_ctx_train)),
        huge_page_share_(huge_page_share) {
    placement_ = placement_all_on(model_.catalog(), "cpu");
    if (o.profile) profile_.emplace();
    if (o.count_routing) routing_counts_.assign(sz(model_.hparams().n_layer) * sz(model_.hparams().n_expert), 0);
    in_tick_.assign(slots_.size(), false);
  }

  std::vector<uint64_t> routing_counts() const override { return routing_counts_; }

  std::string name() const override { return "cpu"; }
  std::string profile_report() const override { return profile_ ? profile_->report() : std::string(); }
  void profile_reset() override {
    if (profile_) *profile_ = StepProfile{};
  }
  std::string summary() const override {
    // int8 only where the level has int8 kernels (gemv_kernel falls back to f32 otherwise).
    const bool int8 = mm_.activations() == GemvInput::kQ8 &&
                      gemv_kernel(mm_.isa(), GgmlType::kQ4_0, GemvInput::kQ8).input == GemvInput::kQ8;
    std::string s = std::string(isa_name(mm_.isa())) + (int8 ? ", int8" : ", f32") + ", " +
                    std::to_string(pool_->n_threads() + 1) + " threads";
    if (huge_page_share_ >= 0.0) {
      s += ", weights " + std::to_string(static_cast<int>(std::lround(100.0 * huge_page_share_))) + "% in 2 MiB pages";
    }
    return s;
  }
  const ModelHparams& hparams() const override { return model_.hparams(); }
  const PlacementPlan& placement() const override { return placement_; }
  EngineCachePool cache_pool() const override { return {}; }  // each slot owns its KV cache: no shared pool
  EngineCapabilities capabilities() const override {
    EngineCapabilities c;
    c.max_items_per_pass = static_cast<int32_t>(slots_.size());
    c.max_tokens_per_item = kPassTokensPerItem;  // one pass a tick: a long prompt does not hold decode back long
    c.max_slot_ctx = max_ctx_;
    return c;
  }
  int32_t max_slots() const override { return static_cast<int32_t>(slots_.size()); }

  Expected<SlotId> slot_alloc(int32_t n_ctx) override {
    if (n_ctx < 1 || (max_ctx_ > 0 && n_ctx > max_ctx_)) {
      return make_error(ErrorCode::kOutOfRange, "n_ctx " + std::to_string(n_ctx) + " is outside [1, " +
                                                    std::to_string(max_ctx_) + "] (the CPU engine's context)");
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i]) continue;
      KESTREL_TRY_ASSIGN(ref::SessionState state, ref::SessionState::create(model_.hparams(), n_ctx));
      slots_[i].emplace(std::move(state));
      return static_cast<SlotId>(i);
    }
    return make_error(ErrorCode::kResourceExhausted,
                      "all " + std::to_string(slots_.size()) + " CPU engine slots are in use");
  }

  void slot_free(SlotId slot) override {
    if (valid(slot)) slots_[sz(slot)].reset();
  }
  void slot_reset(SlotId slot) override {
    if (valid(slot)) slots_[sz(slot)]->reset();
  }

  Status slot_clone(SlotId src, SlotId dst) override {
    if (!valid(src) || !valid(dst)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "slot_clone: slot " + std::to_string(valid(src) ? dst : src) + " is not allocated");
    }
    if (src == dst) return ok_status();
    return slots_[sz(dst)]->copy_from(*slots_[sz(src)]);
  }

  Expected<std::vector<uint8_t>> slot_snapshot(SlotId slot) const override {
    if (!valid(slot)) return not_allocated(slot);
    return slots_[sz(slot)]->snapshot();
  }
  Status slot_restore(SlotId slot, std::span<const uint8_t> bytes) override {
    if (!valid(slot)) return not_allocated(slot);
    return slots_[sz(slot)]->restore(bytes);
  }
  int64_t slot_n_past(SlotId slot) const override { return valid(slot) ? slots_[sz(slot)]->n_past() : 0; }
  int32_t slot_n_ctx(SlotId slot) const override { return valid(slot) ? slots_[sz(slot)]->n_ctx() : 0; }

  Status check(const EngineStepItem& item) const override {
    if (!valid(item.slot)) return not_allocated(item.slot);
    return ref::check_tokens(weights_, *slots_[sz(item.slot)], item.tokens);
  }

  void step(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out) override;

 private:
  bool valid(SlotId slot) const { return slot >= 0 && sz(slot) < slots_.size() && slots_[sz(slot)].has_value(); }
  static Error not_allocated(SlotId slot) {
    return Error{ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) + " is not allocated"};
  }

  // Runs the rows of `segments` (tokens in tokens_, f32 hidden rows in h_) through every layer.
  void run_layers(const Pass& pass);

  const Model& model_;
  ref::RefModelWeights weights_;
  std::vector<std::optional<ref::SessionState>> slots_;
  std::unique_ptr<WorkerPool> pool_;
  MatmulRunner mm_;
  int32_t max_ctx_;
  double huge_page_share_;  // tensor_data_huge_page_share after populating; −1: not known or not populated
  PlacementPlan placement_;
  std::optional<StepProfile> profile_;    // CpuEngineOptions::profile
  std::vector<uint64_t> routing_counts_;  // CpuEngineOptions::count_routing: [n_layer][n_expert]; empty: not counted

  GdnBlock gdn_;
  AttentionBlock attn_;
  FfnBlock ffn_;
  // Per-step scratch, grown to the largest step seen.
  std::vector<bool> in_tick_;          // [max_slots]: the slot already has an item this tick
  std::vector<size_t> live_, offset_;  // indices of the items that run; tokens consumed of each
  std::vector<Segment> segments_;      // this pass's sessions
  std::vector<size_t> segment_item_;   // the item of each segment
  std::vector<int32_t> tokens_;        // int32 [R]: this pass's tokens
  std::vector<float> h_, x_, y_;       // f32 [R, H]: residual stream, normed input, sub-layer output
  std::vector<float> last_, logits_;   // f32 [n_done, H], f32 [n_done, n_vocab]
  std::vector<size_t> done_;           // the segments whose item ends in this pass
};

void CpuEngineImpl::run_layers(const Pass& pass) {
  const size_t R = sz(pass.n_rows), H = model_.hparams().n_embd;
  const float eps = model_.hparams().rms_eps;
  float* h = h_.data();
  float* x = grow(x_, R * H);
  float* y = grow(y_, R * H);
  // Row by row (each row's bits whatever the split): on the calling thread for one row, over the pool for more (a
  // prompt's pass holds up to a hundred and more).
  auto each_row = [&](auto&& fn) {
    if (R == 1) {
      fn(int64_t{0});
    } else {
      pass.mm->pool().for_each(static_cast<int64_t>(R), fn);
    }
  };
  auto norm_rows = [&](const float* w) {
    auto one = [&](int64_t r) { ref::rms_norm(h + sz(r) * H, w, static_cast<int>(H), eps, x + sz(r) * H); };
    each_row(one);
  };
  auto add_rows = [&] {
    auto one = [&](int64_t r) {
      for (size_t i = sz(r) * H; i < (sz(r) + 1) * H; ++i) h[i] += y[i];
    };
    each_row(one);
  };
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const ref::RefLayerWeights& lw = weights_.layers[l];
    const uint32_t li = static_cast<uint32_t>(l);
    {
      const SectionTimer t(pass.profile, StepSection::kNorms);
      norm_rows(lw.attn_norm);
    }
    if (lw.kind == LayerKind::kGatedDeltaNet) {
      gdn_.run(pass, lw.gdn, li, x, y);  // times its own parts
    } else {
      const SectionTimer t(pass.profile, StepSection::kAttention);
      attn_.run(pass, lw.attn, li, x, y);
    }
    {
      const SectionTimer t(pass.profile, StepSection::kNorms);
      add_rows();
      norm_rows(lw.post_attention_norm);
    }
    if (lw.is_moe) {
      const size_t E = sz(model_.hparams().n_expert);
      ffn_.run_moe(pass, lw.moe, x, y, routing_counts_.empty() ? nullptr : routing_counts_.data() + l * E);
    } else {
      const SectionTimer t(pass.profile, StepSection::kDenseFfn);
      ffn_.run_dense(pass, lw.dense, x, y);
    }
    const SectionTimer t(pass.profile, StepSection::kNorms);
    add_rows();
  }
}

void CpuEngineImpl::step(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out) {
  if (profile_) ++profile_->steps;
  const size_t n_items = std::min(items.size(), out.size());
  const size_t H = model_.hparams().n_embd, V = model_.hparams().n_vocab;
  const float eps = model_.hparams().rms_eps;
  live_.clear();
  std::fill(in_tick_.begin(), in_tick_.end(), false);
  for (size_t i = 0; i < n_items; ++i) {
    EngineStepOutput& o = out[i];
    o.status = check(items[i]);
    if (o.status && in_tick_[sz(items[i].slot)]) {
      o.status = make_error(ErrorCode::kInvalidArgument,
                            "slot " + std::to_string(items[i].slot) + " has two items in one tick");
    }
    if (o.status && !(items[i].argmax_only && o.logits.empty()) && o.logits.size() != V) {
      o.status =
          make_error(ErrorCode::kInternal, "step: the caller's logits buffer holds " + std::to_string(o.logits.size()) +
                                               " floats, not n_vocab = " + std::to_string(V));
    }
    if (!o.status) continue;
    in_tick_[sz(items[i].slot)] = true;
    live_.push_back(i);
  }
  offset_.assign(n_items, 0);

  for (;;) {
    // One pass: up to kPassTokensPerItem next tokens of every item that has tokens left.
    segments_.clear();
    segment_item_.clear();
    tokens_.clear();
    for (size_t i : live_) {
      const size_t left = items[i].tokens.size() - offset_[i];
      if (left == 0) continue;
      const int n = static_cast<int>(std::min<size_t>(left, kPassTokensPerItem));
      ref::SessionState* st = &*slots_[sz(items[i].slot)];
      segments_.push_back(Segment{st, static_cast<int>(tokens_.size()), n, st->n_past()});
      segment_item_.push_back(i);
      tokens_.insert(tokens_.end(), items[i].tokens.begin() + static_cast<std::ptrdiff_t>(offset_[i]),
                     items[i].tokens.begin() + static_cast<std::ptrdiff_t>(offset_[i]) + n);
    }
    if (segments_.empty()) break;
    const size_t R = tokens_.size();
    Pass pass;
    pass.mm = &mm_;
    pass.profile = profile_ ? &*profile_ : nullptr;
    pass.segments = segments_;
    pass.n_rows = static_cast<int>(R);

    // Embedding rows (token_embd dequantized, as the reference does).
    std::optional<SectionTimer> timer(std::in_place, pass.profile, StepSection::kEmbedding);
    float* h = grow(h_, R * H);
    const uint64_t embd_row = *ggml_row_bytes(weights_.token_embd.type, weights_.token_embd.n_in);
    for (size_t r = 0; r < R; ++r) {
      (void)dequantize_row(weights_.token_embd.type, weights_.token_embd.data + sz(tokens_[r]) * embd_row, h + r * H,
                           static_cast<int64_t>(H));
    }
    timer.reset();
    run_layers(pass);
    timer.emplace(pass.profile, StepSection::kOutput);

    // Items whose last token is in this pass: output norm and lm_head over their last rows.
    done_.clear();
    for (size_t s = 0; s < segments_.size(); ++s) {
      const size_t i = segment_item_[s];
      offset_[i] += sz(segments_[s].n_tok);
      segments_[s].state->advance(segments_[s].n_tok);
      if (offset_[i] == items[i].tokens.size()) done_.push_back(s);
    }
    if (done_.empty()) continue;
    float* last = grow(last_, done_.size() * H);
    for (size_t j = 0; j < done_.size(); ++j) {
      const Segment& s = segments_[done_[j]];
      ref::rms_norm(h + sz(s.row0 + s.n_tok - 1) * H, weights_.output_norm, static_cast<int>(H), eps, last + j * H);
    }
    float* logits = grow(logits_, done_.size() * V);
    const GemvTask t[1] = {task_of(weights_.output, last, static_cast<int64_t>(done_.size()), logits)};
    mm_.run(t);
    for (size_t j = 0; j < done_.size(); ++j) {
      const size_t i = segment_item_[done_[j]];
      const std::span<const float> row(logits + j * V, V);
      if (items[i].argmax_only) out[i].argmax = argmax_lowest(row);
      if (!out[i].logits.empty()) std::copy(row.begin(), row.end(), out[i].logits.begin());
    }
  }
}

}  // namespace

Expected<std::unique_ptr<CpuEngine>> make_cpu_engine(const Model& model, const CpuEngineOptions& options) {
  if (options.max_slots < 1) {
    return make_error(ErrorCode::kInvalidArgument, "the CPU engine needs at least one slot (got max_slots = " +
                                                       std::to_string(options.max_slots) + ")");
  }
  if (options.threads < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the CPU engine's thread count must be >= 0 (got " + std::to_string(options.threads) + ")");
  }
  KESTREL_TRY_ASSIGN(ref::RefModelWeights weights, ref::RefModelWeights::from_catalog(model.catalog()));
  KESTREL_TRY(check_kernels(weights));
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(physical_core_cpus().size());
  // The caller's thread computes too (WorkerPool::run), so the pool holds one thread fewer.
  KESTREL_TRY_ASSIGN(std::unique_ptr<WorkerPool> pool, WorkerPool::create(std::max(threads, 1) - 1, options.pin));
  double huge_page_share = -1.0;
  if (options.populate) {
    populate_tensor_data(model.file(), *pool);
    huge_page_share = tensor_data_huge_page_share(model.file());
  }
  const Isa isa = options.isa ? isa_choose(isa_name(*options.isa)) : isa_selected();
  return std::unique_ptr<CpuEngine>(
      std::make_unique<CpuEngineImpl>(model, std::move(weights), options, std::move(pool), isa, huge_page_share));
}

}  // namespace kestrel::cpu
