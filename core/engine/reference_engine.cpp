// The reference Engine (reference_engine.h): slots of ref::SessionState, one ref::forward per item per tick.
#include "core/engine/reference_engine.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/reference/forward.h"
#include "core/reference/model_weights.h"
#include "core/reference/session_state.h"
#include "core/sampler/logit_scan.h"

namespace kestrel {
namespace {

class ReferenceEngine final : public Engine {
 public:
  ReferenceEngine(const Model& model, ref::RefModelWeights weights, int32_t max_slots)
      : model_(model), weights_(std::move(weights)), slots_(static_cast<size_t>(max_slots)) {
    placement_ = placement_all_on(model_.catalog(), "cpu");
  }

  std::string name() const override { return "reference"; }
  const ModelHparams& hparams() const override { return model_.hparams(); }
  const PlacementPlan& placement() const override { return placement_; }
  EngineCachePool cache_pool() const override { return {}; }  // each slot owns its KV cache: no shared pool
  EngineCapabilities capabilities() const override {
    EngineCapabilities c;
    c.max_items_per_pass = 1;  // one ref::forward per item
    c.max_slot_ctx = static_cast<int32_t>(model_.hparams().n_ctx_train);
    return c;
  }
  int32_t max_slots() const override { return static_cast<int32_t>(slots_.size()); }

  Expected<SlotId> slot_alloc(int32_t n_ctx) override {
    if (n_ctx < 1) {
      return make_error(ErrorCode::kOutOfRange, "a slot needs n_ctx >= 1 (got " + std::to_string(n_ctx) + ")");
    }
    const uint32_t n_train = model_.hparams().n_ctx_train;
    if (n_train > 0 && static_cast<uint32_t>(n_ctx) > n_train) {
      return make_error(ErrorCode::kOutOfRange, "n_ctx " + std::to_string(n_ctx) +
                                                    " is larger than the model's training context, " +
                                                    std::to_string(n_train));
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i]) continue;
      KESTREL_TRY_ASSIGN(ref::SessionState state, ref::SessionState::create(model_.hparams(), n_ctx));
      slots_[i].emplace(std::move(state));
      return static_cast<SlotId>(i);
    }
    return make_error(ErrorCode::kResourceExhausted,
                      "all " + std::to_string(slots_.size()) + " reference engine slots are in use");
  }

  void slot_free(SlotId slot) override {
    if (valid(slot)) slots_[static_cast<size_t>(slot)].reset();
  }

  void slot_reset(SlotId slot) override {
    if (valid(slot)) slots_[static_cast<size_t>(slot)]->reset();
  }

  Status slot_clone(SlotId src, SlotId dst) override {
    if (!valid(src) || !valid(dst)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "slot_clone: slot " + std::to_string(valid(src) ? dst : src) + " is not allocated");
    }
    if (src == dst) return ok_status();
    return slots_[static_cast<size_t>(dst)]->copy_from(*slots_[static_cast<size_t>(src)]);
  }

  Expected<std::vector<uint8_t>> slot_snapshot(SlotId slot) const override {
    if (!valid(slot))
      return make_error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) + " is not allocated");
    return state(slot).snapshot();
  }

  Status slot_restore(SlotId slot, std::span<const uint8_t> bytes) override {
    if (!valid(slot))
      return make_error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) + " is not allocated");
    return slots_[static_cast<size_t>(slot)]->restore(bytes);
  }

  int64_t slot_n_past(SlotId slot) const override { return valid(slot) ? state(slot).n_past() : 0; }
  int32_t slot_n_ctx(SlotId slot) const override { return valid(slot) ? state(slot).n_ctx() : 0; }

  Status check(const EngineStepItem& item) const override {
    if (!valid(item.slot)) {
      return make_error(ErrorCode::kInvalidArgument, "slot " + std::to_string(item.slot) + " is not allocated");
    }
    return ref::check_tokens(weights_, state(item.slot), item.tokens);
  }

  void step(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out) override {
    ref::ForwardOptions options;
    options.gdn_mode = ref::GdnMode::kRecurrent;  // chunking-independent (file comment)
    for (size_t i = 0; i < items.size() && i < out.size(); ++i) {
      EngineStepOutput& o = out[i];
      if (Status st = check(items[i]); !st) {
        o.status = std::move(st);
        continue;
      }
      ref::ForwardOutput fwd;
      o.status = ref::forward(weights_, *slots_[static_cast<size_t>(items[i].slot)], items[i].tokens, options, &fwd);
      if (!o.status) continue;
      if (items[i].argmax_only) o.argmax = argmax_lowest(fwd.logits);
      if (items[i].argmax_only && o.logits.empty()) continue;
      if (o.logits.size() != fwd.logits.size()) {  // f32 [n_vocab]: all_logits is off
        o.status = make_error(ErrorCode::kInternal, "step: the caller's logits buffer holds " +
                                                        std::to_string(o.logits.size()) +
                                                        " floats, not n_vocab = " + std::to_string(fwd.logits.size()));
        continue;
      }
      std::copy(fwd.logits.begin(), fwd.logits.end(), o.logits.begin());
    }
  }

 private:
  bool valid(SlotId slot) const {
    return slot >= 0 && static_cast<size_t>(slot) < slots_.size() && slots_[static_cast<size_t>(slot)].has_value();
  }
  const ref::SessionState& state(SlotId slot) const { return *slots_[static_cast<size_t>(slot)]; }

  const Model& model_;
  ref::RefModelWeights weights_;
  std::vector<std::optional<ref::SessionState>> slots_;
  PlacementPlan placement_;
};

}  // namespace

PlacementPlan placement_all_on(const WeightCatalog& catalog, const std::string& device) {
  uint64_t embeddings = 0, gdn = 0, attn = 0, routed = 0, shared = 0, lm_head = 0;
  const std::vector<LayerWeights>& layers = catalog.layers();
  for (const CatalogEntry& e : catalog.entries()) {
    if (e.skipped || e.info == nullptr) continue;
    const uint64_t bytes = e.info->n_bytes;
    if (e.placement == PlacementClass::kRoutedExperts) {
      routed += bytes;
    } else if (e.placement == PlacementClass::kSharedExpert) {
      shared += bytes;
    } else if (e.layer < 0) {
      (e.info->name == "token_embd.weight" ? embeddings : lm_head) += bytes;
    } else if (static_cast<size_t>(e.layer) < layers.size() &&
               layers[static_cast<size_t>(e.layer)].kind == LayerKind::kFullAttention) {
      attn += bytes;
    } else {
      gdn += bytes;
    }
  }
  PlacementPlan out;
  out.device = device;
  auto add = [&](const char* component, uint64_t bytes) { out.entries.push_back({component, device, bytes}); };
  add("embeddings", embeddings);
  add("gdn layers", gdn);
  add("attention layers", attn);
  add("routed experts", routed);
  add("shared experts", shared);
  add("lm_head", lm_head);
  return out;
}

Expected<std::unique_ptr<Engine>> make_reference_engine(const Model& model, int32_t max_slots) {
  if (max_slots < 1) {
    return make_error(ErrorCode::kInvalidArgument, "the reference engine needs at least one slot (got max_slots = " +
                                                       std::to_string(max_slots) + ")");
  }
  KESTREL_TRY_ASSIGN(ref::RefModelWeights weights, ref::RefModelWeights::from_catalog(model.catalog()));
  return std::unique_ptr<Engine>(std::make_unique<ReferenceEngine>(model, std::move(weights), max_slots));
}

}  // namespace kestrel
