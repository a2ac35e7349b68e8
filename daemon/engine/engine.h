// Engine: the compute side of kestreld behind one narrow interface: state slots plus one batched forward per tick.
// The reference engine (reference_engine.h) implements it on core/reference today; the CPU and GPU executors
// implement the same interface later, with slots that live on their device (design.md §3 "State").
//
// A slot is one sequence's model state (GDN state + conv history per GDN layer, KV cache per attention layer,
// token history). Slots are numbered 0..max_slots()-1 and recycled.
//
// Threading: no method is thread-safe, and calls must never overlap. The Service serialises them with one mutex
// (ServiceImpl::engine_mu_) held around every Engine call: step() (and the sampling that reads slot_tokens) runs on
// the engine loop thread; slot_alloc / slot_clone / slot_reset / slot_free may run on a caller's thread (create,
// clone, reset, close session) or the loop thread, always between two step() calls, never on a slot that a queued
// request is using. An engine that needs thread affinity (CUDA contexts) must set its device itself in each call.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"

namespace kestrel::daemon {

using SlotId = int32_t;

// One sequence's share of a tick: tokens appended to `slot`, logits wanted after the last of them.
struct EngineStepItem {
  SlotId slot = -1;
  std::span<const int32_t> tokens;  // borrowed for the call; >= 1
};

struct EngineStepOutput {
  Status status;              // an error fails this item only (its slot is unchanged); the others proceed
  std::vector<float> logits;  // f32 [n_vocab] after the item's last token, when status is ok
};

struct PlacementSummaryEntry {
  std::string component;
  std::string device;
  uint64_t bytes = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual std::string name() const = 0;  // "reference", "cuda"
  virtual const ModelHparams& hparams() const = 0;
  virtual std::vector<PlacementSummaryEntry> placement() const = 0;
  virtual int32_t max_slots() const = 0;

  // A fresh slot with room for n_ctx tokens. kResourceExhausted when none is free or memory runs out;
  // kOutOfRange when n_ctx is larger than the engine supports.
  virtual Expected<SlotId> slot_alloc(int32_t n_ctx) = 0;
  virtual void slot_free(SlotId slot) = 0;
  virtual void slot_reset(SlotId slot) = 0;
  // dst (allocated, any n_ctx >= src's n_past) becomes an exact copy of src.
  virtual Status slot_clone(SlotId src, SlotId dst) = 0;
  virtual int64_t slot_n_past(SlotId slot) const = 0;
  virtual int32_t slot_n_ctx(SlotId slot) const = 0;
  // The tokens the slot has consumed, oldest first (the sampler's penalty window reads it).
  virtual std::span<const int32_t> slot_tokens(SlotId slot) const = 0;

  // Checks one item against its slot without running it: kInvalidArgument for a bad token id or empty tokens,
  // kOutOfRange when the slot's context would overflow.
  virtual Status check(const EngineStepItem& item) const = 0;

  // One tick: every item (distinct slots) advances; weights are read once for the whole batch where the engine can.
  // out.size() == items.size(). Deterministic: the same slot contents and tokens give bit-identical logits whatever
  // else is in the batch.
  virtual void step(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out) = 0;
};

}  // namespace kestrel::daemon
